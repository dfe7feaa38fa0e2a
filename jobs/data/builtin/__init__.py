"""The built-in datasets: identity (self-cognition rows from a bot name and author) mixed with the base
model's own answers to general prompts (generated once per base model and cached)."""
