"""Evaluating a finished job: its base model and its tuned model (base + the job's LoRA adapter) answer
the same prompts, scored by exact match, ROUGE-L, BLEU, chrF and the job's GRPO rewards (preference
pairs: which answer each model's log-probabilities prefer), with the difference and its bootstrap
confidence interval; and lm-evaluation-harness benchmarks on both (`python -m jobs.evaluate CONFIG`).

The peers: LlamaBoard's "Evaluate & Predict" (BLEU and ROUGE over a dataset, MMLU / C-Eval), ms-swift's
EvalScope benchmarks. Modules: config.py the typed config, data.py the rows, generate.py the answers
(jobs/serve's model and engine), metrics.py and table.py the scores, report.py the files, run.py the
whole run, harness.py lm-eval, cli.py the command line; tasks/ the bundled offline benchmark."""
