"""Data: read files row by row (bounded), detect the format, turn rows into conversations, apply the chat
template with answer-only labels, pack examples into rows, and the built-in datasets.

May import jobs.spec, jobs.io and jobs.models (the built-in datasets generate answers with the base model)."""
