"""The documentation checked against the code: README commands, links, the architecture and its layers."""
