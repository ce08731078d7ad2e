#!/usr/bin/python3
"""make_man.py: the performer(1) man page, in roff, from the tool's own help.

    /usr/bin/python3 scripts/make_man.py build/performer >build/performer.1

Runs `performer --help` and `performer CMD --help` for every command the first lists, so the
page says what the tool says. The help is plain text laid out in columns; this reads the few
shapes it has (a usage block, prose paragraphs, a heading such as "options:" over indented
entries "--flag ARG   what it does   [default]") and writes each as its man-page equivalent.
Anything else is kept as it is, in no-fill mode. The date is SOURCE_DATE_EPOCH's, if set.
"""
import os
import re
import subprocess
import sys
import time


def help_text(tool, *args):
    r = subprocess.run([tool, *args, "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"make_man: {tool} {' '.join(args)} --help: exit status {r.returncode}")
    return r.stdout


def esc(s):
    """Text for roff: backslashes, minus signs (options stay ASCII '-' when copied), quotes."""
    s = s.replace("\\", "\\e").replace("-", "\\-").replace("`", "\\(ga").replace("'", "\\(aq")
    return s


def line(s):
    """A text line: one starting with a dot or an apostrophe would be a request."""
    s = esc(s)
    return "\\&" + s if s.startswith((".", "'")) else s


def quoted(s):
    """A macro argument."""
    return '"' + esc(s).replace('"', "\\(dq") + '"'


def blocks(text):
    """Paragraphs: runs of non-blank lines."""
    out, cur = [], []
    for ln in text.splitlines():
        if ln.strip():
            cur.append(ln.rstrip())
        elif cur:
            out.append(cur)
            cur = []
    if cur:
        out.append(cur)
    return out


def indent(ln):
    return len(ln) - len(ln.lstrip(" "))


DEFAULT_COLUMN = re.compile(r"\s*\[default\]\s*$")
TRAILING_DEFAULT = re.compile(r"^(.*?)\s*\[([^\[\]]*)\]$")


def synopsis(lines):
    """A usage block ("usage: performer CMD [options]" and its continuation lines). Text set
    apart by a wide gap that is not an option or a [group] is a note on the usage."""
    usage, notes = [], []
    for ln in lines:
        for piece in re.split(r"\s{2,}", re.sub(r"^usage:", "", ln).strip()):
            (notes if notes or not re.match(r"[\[\-<]|performer", piece) and usage
             else usage).append(piece)
    words = " ".join(usage).split()
    out = [".SY " + esc(words[0])]
    # Each bracketed group is kept on one line of output: no break inside "[--seed S]"; \\&
    # after each, so that "NAME...]" does not end a sentence.
    groups = re.findall(r"\[[^\[\]]*\]|\S+", " ".join(words[1:]))
    out += [esc(g).replace(" ", "\\ ") + "\\&" for g in groups]
    out.append(".YS")
    if notes:
        out += [".PP", line(" ".join(notes))]
    return out


def entries(lines, defaults):
    """Indented entries: a term (an option with its argument, a command, a name) and what it
    means, wrapped onto deeper-indented lines; a trailing "[x]" is the default when the help has
    a [default] column. Returns .TP paragraphs, or None if the lines are not in that shape."""
    base = min(indent(ln) for ln in lines)
    # The description column: where text resumes after two spaces on entry lines.
    cols = []
    for ln in lines:
        if indent(ln) == base:
            m = re.match(r"^(\s*\S.*?\s{2,})\S", ln)
            if m:
                cols.append(len(m.group(1)))
    col = max(set(cols), key=cols.count) if cols else None
    items = []
    for ln in lines:
        if DEFAULT_COLUMN.fullmatch(ln):
            defaults = True
            continue
        if indent(ln) == base:
            m = re.match(r"^\s*(\S.*?)(?:\s{2,}(.*))?$", ln)
            term, desc = m.group(1), m.group(2) or ""
            if not m.group(2) and col and len(ln) > col and ln[col - 1] == " ":
                term, desc = ln[:col].strip(), ln[col:].strip()
            items.append([term, [desc] if desc else [], None])
        elif items:
            items[-1][1].append(ln.strip())
        else:
            return None, defaults
    out = []
    for term, desc, default in items:
        parts = []
        for d in desc:
            m = TRAILING_DEFAULT.match(d) if defaults else None
            if m:
                default = m.group(2)
                d = m.group(1)
            if d:
                parts.append(d)
        words = term.split(" ", 1)
        head = "\\fB" + esc(words[0]) + "\\fR"
        if len(words) > 1:
            head += " \\fI" + esc(words[1]).replace(" ", "\\ ") + "\\fR"
        out += [".TP", head]
        text = " ".join(parts)
        if default is not None:
            text += f" (default: {default})" if text else f"Default: {default}."
        out += [line(text)] if text else []
    return out, defaults


def section(text, level=".SS", skip_usage=False):
    """One help text as man-page paragraphs."""
    out, defaults = [], False
    for blk in blocks(text):
        first = blk[0]
        if first.startswith("usage:"):
            if not skip_usage:
                out += synopsis(blk)
            continue
        heading = DEFAULT_COLUMN.sub("", first)
        if heading != first:
            defaults = True
        if indent(first) == 0 and heading.endswith(":") and len(blk) > 1 and indent(blk[1]) > 0:
            out += [f"{level} {quoted(heading[:-1])}"]
            body, defaults = entries(blk[1:], defaults)
            out += body if body is not None else verbatim(blk[1:])
        elif all(indent(ln) > 0 for ln in blk):
            body, defaults = entries(blk, defaults)
            out += [".PP"] + (body if body is not None else verbatim(blk))
        elif all(indent(ln) == 0 for ln in blk):
            for ln in blk:
                # "Exit status: ..." starts a paragraph of its own.
                if ln is first or ln.startswith("Exit status:"):
                    out.append(".PP")
                out.append(line(ln.strip()))
        else:
            out += [".PP"] + verbatim(blk)
    return out


def verbatim(lines):
    return [".nf"] + [line(ln) for ln in lines] + [".fi"]


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_man.py PATH/TO/performer")
    tool = sys.argv[1]
    top = help_text(tool)
    bl = blocks(top)

    # "performer 0.1.0: what it is", possibly over two lines.
    m = re.match(r"^(\S+) (\S+): (.*)$", " ".join(bl[0]))
    if not m:
        sys.exit("make_man: the first line of --help is not 'performer VERSION: ...'")
    name, version, what = m.groups()
    # The commands: the entries under "commands:".
    commands = []
    for blk in bl:
        if blk[0].strip() == "commands:":
            commands = [ln.split()[0] for ln in blk[1:] if indent(ln) > 0 and ln.split()]
    if not commands:
        sys.exit("make_man: --help lists no commands")

    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))
    date = time.strftime("%Y-%m-%d", time.gmtime(epoch))
    out = [
        f'.\\" {name}.1: generated by scripts/make_man.py from `{name} --help`; do not edit.',
        f".TH {name.upper()} 1 {date} {quoted(name + ' ' + version)} \"User Commands\"",
        ".SH NAME",
        f"{esc(name)} \\- {line(what.rstrip('.'))}",
        ".SH SYNOPSIS",
    ]
    for blk in bl:
        if blk[0].startswith("usage:"):
            for ln in blk:
                usage = re.split(r"\s{2,}", re.sub(r"^usage:", "", ln).strip())[0]
                out += synopsis([usage])
    # The rest of the top-level help: the commands, what the tool reads, its exit status.
    out += [".SH DESCRIPTION"]
    exits, rest, commands_body = [], [], []
    for blk in bl[1:]:
        first = blk[0]
        if first.startswith("usage:") or first.startswith(name + " "):
            continue  # the synopses: above, and each command's below
        if first.strip() == "commands:":
            body, _ = entries(blk[1:], False)
            commands_body = [".SH COMMANDS"] + (body or verbatim(blk[1:]))
            continue
        for i, ln in enumerate(blk):
            if ln.startswith("Exit status:"):
                exits, blk = blk[i:], blk[:i]
                break
        if blk:
            rest.append("\n".join(blk))
    out += section("\n\n".join(rest))
    out += [".PP", f"\\fB{esc(name)}\\fR \\fIcommand\\fR \\fB\\-\\-help\\fR lists a command's"
            " options with their defaults; each command has a section below."]
    out += commands_body
    if exits:
        out += [".SH \"EXIT STATUS\""] + [line(re.sub(r"^Exit status:\s*", "", ln).strip())
                                          for ln in exits]
    for cmd in commands:
        out += [f".SH {quoted(name.upper() + ' ' + cmd.upper())}"]
        out += section(help_text(tool, cmd))
    out += [
        ".SH SEE ALSO",
        f"The README of the {esc(name)} sources, and the header",
        ".I performer.h",
        "for the C library.",
    ]
    sys.stdout.write("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
