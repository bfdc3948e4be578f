"""End-to-end tests across the stack: answers equal plain decoding (greedy and sampled) whatever drafts, bad input
is one line, same question same answer, recurrent models, structured output that parses."""
