"""Chat templates of real model families and a tokenizer wearing one (shared by the Ollama, Modelfile and
text-field export tests; the tokenizer itself is the `base_tokenizer` fixture of conftest.py)."""

SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
           "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
           "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
           "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
           "{% endif %}")
LLAMA3 = ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
          "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")


def with_template(tokenizer, template, bos=None):
    tokenizer = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, eos_token=tokenizer.eos_token,
                                    bos_token=bos)
    tokenizer.chat_template = template
    return tokenizer
