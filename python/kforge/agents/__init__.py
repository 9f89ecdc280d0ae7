"""The LLM agents' content: prompts, tool definitions, budgets and prices.

The conversation engine that uses them (retries, tool round trips, transcripts) is
`kforge.providers.llm`; the wire protocols are `kforge.providers.anthropic` and
`kforge.providers.openai_compat`.
"""
