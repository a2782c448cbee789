"""The lines a short GPU call prints and keeps: each printed at once (flushed, so a call cut off
still shows how far it got), and all of them rewritten to $OUT/<file> after every line, so the
file comes back whatever ends the call."""
import os


class Transcript:
    def __init__(self, file: str):
        self.file, self.lines = file, []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], self.file), "w") as f:
                f.write("\n".join(self.lines) + "\n")
