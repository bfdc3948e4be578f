"""What the tests share: synthetic models and heads, checkpoint writers, references, and assertion helpers."""
