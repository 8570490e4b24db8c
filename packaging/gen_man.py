#!/usr/bin/env python3
"""Writes a man page (roff, section 1) for a muster program from its --help.

Usage: gen_man.py PROGRAM_BINARY NAME VERSION > NAME.1

Every muster binary prints its help the same way (common/flags.cc):

    NAME: one-line description.
    Usage: NAME ...            (continued by indented lines)

    Free text, and blocks such as "Commands:" with indented rows.

    Flags:
      --flag VALUE           (or "-f, --flag VALUE": with a one-letter alias)
          Help text, several lines.
          (default: ...)

so the page is: NAME from the first line, SYNOPSIS from the usage lines,
DESCRIPTION from the free text (indented rows stay as they are, a line ending
in ':' is a subsection) and OPTIONS from the flag list. Generating the page
from --help keeps it from drifting from the program.
"""
import datetime
import os
import re
import subprocess
import sys

PROGRAMS = ["musterd", "musterctl", "muster-run"]


def esc(text):
    """Escapes text for roff: backslashes, dashes, a leading control char."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    if text.startswith((".", "'")):
        text = "\\&" + text
    return text


def render(name, version, help_text):
    lines = help_text.rstrip("\n").split("\n")
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    date_text = (datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
                 .strftime("%Y-%m-%d") if epoch else "")
    title = esc(name.upper())
    out = [f'.TH {title} 1 "{date_text}" "muster {version}" "User Commands"']

    first = lines.pop(0) if lines else name
    summary = first.split(":", 1)[1].strip() if ":" in first else first
    out += [".SH NAME", f"{esc(name)} \\- {esc(summary.rstrip('.'))}"]

    # SYNOPSIS: "Usage: ..." and the indented lines continuing it.
    synopsis = []
    while lines and not lines[0].startswith("Usage:") and lines[0].strip() == "":
        lines.pop(0)
    if lines and lines[0].startswith("Usage:"):
        synopsis.append(lines.pop(0)[len("Usage:"):].strip())
        while lines and lines[0].startswith(" ") and lines[0].strip():
            synopsis.append(lines.pop(0).strip())
    if synopsis:
        out += [".SH SYNOPSIS", ".nf"] + [esc(s) for s in synopsis] + [".fi"]

    # Split the rest at "Flags:".
    try:
        flags_at = lines.index("Flags:")
    except ValueError:
        flags_at = len(lines)
    description, flag_lines = lines[:flags_at], lines[flags_at + 1:]

    out.append(".SH DESCRIPTION")
    paragraph, block = [], []

    def flush():
        if paragraph:
            out.append(".PP")
            out.append(esc(" ".join(p.strip() for p in paragraph)))
            paragraph.clear()
        if block:
            out.extend([".PP", ".nf"] + [esc(b) for b in block] + [".fi"])
            block.clear()

    for line in description:
        if not line.strip():
            flush()
        elif line.startswith(" "):
            if paragraph:
                flush()
            block.append(line)
        elif line.rstrip().endswith(":") and len(line) < 40:
            flush()
            out.append(f".SS {esc(line.rstrip().rstrip(':'))}")
        else:
            if block:
                flush()
            paragraph.append(line)
    flush()

    out.append(".SH OPTIONS")
    current = None
    for line in flag_lines:
        stripped = line.strip()
        if not stripped:
            continue
        flag_line = re.match(r"^  (-[A-Za-z], )?(--[A-Za-z0-9_-]+)( [A-Z]+)?$", line)
        if flag_line:
            if current is not None:
                out.append(esc(" ".join(current)))
            short, flag, value = flag_line.groups()
            names = (f"\\fB{esc(short[:-2])}\\fR, " if short else "") + f"\\fB{esc(flag)}\\fR"
            out.append(".TP")
            out.append(names + (f" \\fI{esc(value.strip())}\\fR" if value else ""))
            current = []
        elif current is not None:
            current.append(stripped)
    if current:
        out.append(esc(" ".join(current)))

    others = [p for p in PROGRAMS if p != name]
    out += [".SH SEE ALSO",
            ", ".join(f"\\fB{esc(p)}\\fR(1)" for p in others) + ".",
            ".PP",
            "The README in /usr/share/doc/muster (or the prefix's share/doc/muster)."]
    return "\n".join(out) + "\n"


def main(argv):
    if len(argv) != 4:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    binary, name, version = argv[1:]
    help_text = subprocess.run([binary, "--help"], check=True, stdout=subprocess.PIPE,
                               text=True, timeout=60).stdout
    if not help_text.strip():
        sys.stderr.write(f"gen_man: {binary} --help printed nothing\n")
        return 1
    sys.stdout.write(render(name, version, help_text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
