"""General prompts (English and Chinese) whose answers the identity recipe takes from the base model
itself, so that learning a new name does not overwrite what the model already knows.

Short, factual or everyday questions: their answers are short, which keeps the default run fast,
and they cover what a user checks first after tuning (facts, arithmetic, advice, translation,
writing). None asks who the model is: those questions belong to the identity rows. The test
question "What is the capital of France?" is deliberately NOT here, so the test measures what the
model kept, not what it was shown."""
from __future__ import annotations

PROMPTS_EN = [
    "What is the capital of Japan?", "What is the capital of Italy?", "What is the capital of Germany?",
    "What is the capital of Spain?", "What is the capital of Canada?", "What is the capital of Australia?",
    "What is the capital of China?", "What is the capital of Egypt?", "What is the capital of Brazil?",
    "What is the largest ocean on Earth?", "What is the tallest mountain in the world?",
    "Which planet is closest to the Sun?", "Which planet is known as the Red Planet?",
    "How many continents are there?", "What is the longest river in Africa?",
    "What is the boiling point of water in Celsius?", "What is the chemical symbol for gold?",
    "What gas do plants absorb from the air?", "What is H2O?", "How many legs does a spider have?",
    "What is the speed of light, roughly?", "What causes the seasons on Earth?",
    "Why is the sky blue?", "What is photosynthesis?", "What is gravity?",
    "What is 12 times 12?", "What is 15 plus 27?", "What is the square root of 81?",
    "What is 100 divided by 4?", "Is 17 a prime number?", "What is 3 to the power of 4?",
    "Who wrote Romeo and Juliet?", "Who painted the Mona Lisa?", "Who was the first person to walk on the Moon?",
    "Who developed the theory of relativity?", "In which year did World War II end?",
    "What language is spoken in Brazil?", "What currency is used in the United Kingdom?",
    "How many days are there in a leap year?", "How many minutes are in an hour?",
    "What is the opposite of 'hot'?", "What is a synonym for 'happy'?", "What is the plural of 'mouse'?",
    "Translate 'thank you' into French.", "Translate 'good morning' into Spanish.",
    "Give me three tips for better sleep.", "How can I stay focused while studying?",
    "Suggest a healthy breakfast.", "How do I make a cup of tea?", "What should I pack for a beach trip?",
    "Give me a tip for saving money.", "How do I boil an egg?", "What are the benefits of regular exercise?",
    "Write a haiku about autumn.", "Write one sentence about the ocean.", "Tell me a short joke.",
    "Give me a name for a pet cat.", "Describe a sunset in one sentence.",
    "What is a noun?", "What is the difference between weather and climate?",
    "What is the main function of the heart?", "What do bees make?", "What is the freezing point of water?",
    "What is an atom?", "What is democracy?", "What is the internet?",
    "What does a computer's CPU do?", "What is Python used for?", "What is an algorithm?",
    "Write a Python function that adds two numbers.", "What does HTML stand for?",
    "What is the capital city of South Korea?", "Name three primary colors.",
    "How many sides does a hexagon have?", "What is the largest mammal?",
    "What is the smallest prime number?", "Summarize the story of Cinderella in one sentence.",
    "What is a good way to learn a new language?", "Why is recycling important?",
    "What is the difference between a virus and a bacterium?", "How does a rainbow form?",
]

PROMPTS_ZH = [
    "日本的首都是哪里？", "中国的首都是哪里？", "英国的首都是哪里？", "世界上最高的山是什么？",
    "地球上最大的海洋是什么？", "一年有多少个月？", "水的沸点是多少摄氏度？", "太阳系中最大的行星是哪颗？",
    "七乘以八等于多少？", "一百减去三十七等于多少？", "请写一首关于春天的短诗。", "给我三个提高效率的建议。",
    "如何保持身体健康？", "怎样才能睡得更好？", "请用一句话描述大海。", "“谢谢”用英语怎么说？",
    "“你好”用英语怎么说？", "长城在哪个国家？", "《红楼梦》的作者是谁？", "什么是光合作用？",
    "为什么天空是蓝色的？", "一周有几天？", "请推荐一种健康的早餐。", "学习编程应该从哪里开始？",
    "什么是人工智能？", "熊猫主要吃什么？", "中国最长的河流是哪条？", "如何煮米饭？",
    "请讲一个简短的笑话。", "什么是电脑？", "地球绕太阳转一圈需要多长时间？", "春节是哪个国家的传统节日？",
    "一小时有多少分钟？", "请给我一个省钱的小建议。", "什么是民主？", "水是由什么组成的？",
    "为什么要多喝水？", "请用一句话介绍北京。", "三角形有几条边？", "如何学好一门外语？",
]
