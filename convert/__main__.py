"""``python -m convert HEAD_DIR -o OUT.gguf``: the same command as ``eagle2-local convert``."""

from .command import convert_command

if __name__ == "__main__":
    convert_command(prog_name="python -m convert")
