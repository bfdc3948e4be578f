"""Chat: rendering conversations with the model's template, OpenAI tool calls (grammars and parsing), and a
conversation kept within the context."""
