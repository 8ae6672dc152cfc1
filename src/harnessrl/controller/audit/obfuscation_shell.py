"""The ``obfuscated_code`` rule for shell: a script that decodes text and runs it.

A decoder (``base64 -d``, ``xxd -r``, ``openssl … -d``, ``gunzip``/``zcat``/``xz -d``/…,
``uudecode``, ``rev``, ``printf '\\x..'``) piped into an interpreter that reads its program from
stdin (``sh``, ``bash``, ``python``, ``perl``, …), or ``$(…decoder…)`` given to ``eval``, ``bash -c``,
``python -c``, ``source <(…)``, or run as a program. Decoding into a *file* is not flagged here: the
file lands in the workspace, where the audit reads it. The Python side and the rule's reasons are in
``audit.obfuscation``; ``audit.rules`` calls ``shell_obfuscation`` for every shell script.
"""

from __future__ import annotations

import bisect
import posixpath
import re
from collections.abc import Iterator

from harnessrl.controller.audit.invocations import files_run
from harnessrl.controller.audit.obfuscation import OBFUSCATED_CODE
from harnessrl.controller.audit.shell import Segment, wordlist
from harnessrl.controller.audit.shell_commands import (
    output_of,
    positional_args,
    strip_wrappers,
    substitutions,
)

# Programs that decode whatever flag they are given (the others need theirs: ``base64 -d``).
_ALWAYS_DECODES = wordlist("gunzip zcat bunzip2 bzcat unxz xzcat unlzma lzcat unzstd zstdcat uudecode rev")
# Programs that decode with a flag: the long flags, and the letter that may sit in a short cluster.
_DECODE_FLAGS: dict[str, tuple[set[str], str]] = {
    **{p: ({"--decode"}, "dD") for p in ("base64", "base32", "basenc")},
    **{p: ({"--decompress", "--uncompress"}, "d") for p in ("gzip", "bzip2", "xz", "lzma", "zstd")},
    "xxd": ({"-revert"}, "r"),
}
_INTERPRETERS = wordlist("sh bash zsh dash ksh ash mksh fish perl ruby node nodejs php lua tclsh")
_PYTHON_EXE = re.compile(r"^(?:python|pypy)(?:\d+(?:\.\d+)*)?$")
_CODE_FLAG = {"perl": "-e", "ruby": "-e", "node": "-e", "nodejs": "-e", "php": "-r", "lua": "-e"}
_PRINTF_ESCAPES = re.compile(r"\\(?:x[0-9a-fA-F]{2}|[0-7]{3})")
_DECODER_WORDS = (
    r"\b(?:base64|base32|basenc)\s+(?:-\w+\s+)*(?:-d|--decode|-D)\b|\bxxd\s+(?:-\w+\s+)*-r"
    r"|\b(?:gunzip|zcat|bzcat|xzcat|unxz|uudecode)\b|\b(?:gzip|bzip2|xz|zstd)\s+(?:-\w+\s+)*-\w*d"
    r"|\bopenssl\s+(?:enc|base64)\b[^|)]*\s-d\b"
)
_DECODER_TEXT = re.compile(_DECODER_WORDS)
# ``source <(echo … | base64 -d)``, ``bash <(…)``: tokenizing loses the process substitution.
# Each of these patterns ends where a substitution's text starts; ``_decoding`` reads on to its ``)``.
_PROCESS_SUBSTITUTION = re.compile(r"(?:\bsource|(?<![\w./-])\.|\b(?:ba|z|da|k)?sh|\bpython[\d.]*)\s+<\(")


# ``eval $(… | base64 -d)``, ``bash -c $(…)`` unquoted: the tokenizer splits the substitution into
# words and commands of its own, so it is read from the text, like a process substitution.
_RUN_UNQUOTED = re.compile(
    r"(?:\beval|\b(?:ba|z|da|k)?sh\s+(?:-\w+\s+)*-\w*c|\bpython[\d.]*\s+(?:-\w+\s+)*-\w*c)\s+\$\("
)
# Decoded text substituted where the shell runs it: as the program (``$(printf '\\x63url') x``), or as
# the here-string an interpreter reads its program from (``bash <<< "$(… | base64 -d)"``).
_PRINTF_DECODER = r"\bprintf\s+['\"]?[^'\"\s)]*\\(?:x[0-9a-fA-F]{2}|[0-7]{3})"
_DECODED_PROGRAM = re.compile(r"(?:^|[;&|\n(]|\b(?:then|do|else|exec|eval))[ \t]*\"?\$\(")
# Found from the here-string back to the interpreter of its command (``_decoded_here_strings``): one
# pattern from the interpreter on scanned to the end of the line at every ``sh``/``.`` of it, which
# took 30 s on 200 KB of ``ls .git .git …``.
_HERE_STRING_DECODED = re.compile(r"<<<\s*\"?\$\(")
_HERE_STRING_READER = re.compile(r"(?:\b(?:ba|z|da|k)?sh|\bpython[\d.]*|\bperl|\bsource|(?<![\w./-])\.)\b")
# ``x=$(… | base64 -d)``, ``x=`…``` : a variable that holds decoded text.
_DECODED_VARIABLE = re.compile(r"(?<![\w$])([A-Za-z_]\w*)=[\"']?(?:\$\(|`)")
# What decodes, as each rule reads it (``_DECODED_PROGRAM`` also takes ``| rev``).
_DECODES = re.compile(_DECODER_WORDS)
_DECODES_OR_PRINTF = re.compile(rf"{_DECODER_WORDS}|{_PRINTF_DECODER}")
_DECODES_OR_REVERSES = re.compile(rf"{_DECODER_WORDS}|{_PRINTF_DECODER}|\|\s*rev\b")


def shell_obfuscation(script: str, segments: list[Segment]) -> Iterator[tuple[str, str]]:
    """Decoded text run as a program: piped into an interpreter, substituted into ``eval``/``-c``, held
    in a variable that is then run (``x=$(… | base64 -d); $x …``, ``eval $x``), or written to a file
    the same script runs (``… | base64 -d > /tmp/a; bash /tmp/a``)."""
    for opener, decodes in (
        (_PROCESS_SUBSTITUTION, _DECODES),
        (_RUN_UNQUOTED, _DECODES),
        (_DECODED_PROGRAM, _DECODES_OR_REVERSES),
    ):
        for match, end in _decoding(script, opener, decodes):
            yield OBFUSCATED_CODE, script[match.start() : end].strip(" \t\n;&|(")
    yield from _decoded_here_strings(script)
    names = sorted({m.group(1) for m, _ in _decoding(script, _DECODED_VARIABLE, _DECODES_OR_PRINTF, "`")})
    decoded_ref = re.compile(rf"\$\{{?(?:{'|'.join(names)})\b") if names else None
    run = files_run(segments)
    decoder: str | None = None  # the decoding command earlier in the current pipeline
    translated: str | None = None  # a ``tr`` earlier in it (``echo phey | tr a-z n-za-m | sh``)
    previous: Segment | None = None
    for segment in segments:
        words = strip_wrappers(segment.words)
        prog = posixpath.basename(words[0]) if words else ""
        if not segment.piped:
            decoder = translated = None
        if (decoder or translated) is not None and _reads_program_from_stdin(prog, words[1:]):
            yield OBFUSCATED_CODE, decoder or translated
        if _decodes(prog, words[1:]):
            decoder = " ".join(words)
        elif prog == "tr":  # only into an interpreter: ``tr -d '\r' < a.sh > b.sh; bash b.sh`` is honest
            translated = " ".join(words)
        if decoder is not None:  # decoded text written to a file this script runs
            targets = [t for op, t in segment.redirects if ">" in op]
            if prog == "tee":
                targets += positional_args(words[1:], set())[0]
            for target in targets:
                if posixpath.normpath(target) in run:
                    yield OBFUSCATED_CODE, decoder
        for inner in (s for word in words[1:] for s in substitutions(word)):
            if _DECODER_TEXT.search(inner) and _runs_argument(prog, words[1:]):
                yield OBFUSCATED_CODE, inner
        if decoded_ref is not None:
            yield from _runs_decoded_variable(segment, words, prog, previous, decoded_ref)
        previous = segment


def _decoded_here_strings(script: str) -> Iterator[tuple[str, str]]:
    """``bash <<< "$(… | base64 -d)"``: a decoded here-string given to an interpreter of the same
    command (no ``<``, newline, ``;``, ``|`` or ``&`` between them). Each stretch of the script is
    read once: the command's start is looked for back from the here-string, no further than the
    previous one (its ``<<<`` ends any command before it)."""
    previous_end = 0
    for match, end in _decoding(script, _HERE_STRING_DECODED, _DECODES_OR_PRINTF):
        start = max(script.rfind(c, previous_end, match.start()) for c in "<\n;|&") + 1
        start = max(start, previous_end)
        reader = _HERE_STRING_READER.search(script, start, match.start())
        if reader is not None:
            yield OBFUSCATED_CODE, script[reader.start() : end].strip(" \t\n;&|(")
        previous_end = end


def _decoding(
    script: str, opener: re.Pattern[str], decodes: re.Pattern[str], also_closes: str = ""
) -> Iterator[tuple[re.Match[str], int]]:
    """Each ``opener`` match whose substitution (the text up to the next ``)``) holds a decoder,
    with where the substitution ends. ``also_closes``: more characters that end it, where it need
    not be closed (a variable's ``x=`…``` or unclosed ``x=$(…``: it ends at the script's end).

    In time linear in the script: the decoders are found once, and the next ``)`` is looked for
    again only past the last one found. One pattern per rule (a ``$(``, any text, a decoder, any
    text, a ``)``) went back over the rest of the script at every ``$(`` (40 KB of ``$($(…`` took 113 s)."""
    spans = [(m.start(), m.end()) for m in decodes.finditer(script)]
    starts = [start for start, _ in spans]
    closers = ")" + also_closes
    close = -1
    for match in opener.finditer(script):
        if close < match.end():
            found = [at for at in (script.find(c, match.end()) for c in closers) if at >= 0]
            close = min(found, default=len(script))
        if close == len(script) and not also_closes:
            return  # no ``)`` is left: no later substitution is closed either
        i = bisect.bisect_left(starts, match.end())
        if i < len(spans) and spans[i][1] <= close:
            yield match, (close + 1 if close < len(script) else spans[i][1])


def _runs_decoded_variable(
    segment: Segment, words: list[str], prog: str, previous: Segment | None, ref: re.Pattern[str]
) -> Iterator[tuple[str, str]]:
    """A variable holding decoded text, run: as the program, by ``eval``/``-c``, or fed to an
    interpreter on stdin (``<<< "$x"``, ``echo "$x" | sh``)."""
    stdin = segment.stdin
    if stdin is None and segment.piped and previous is not None:
        stdin = output_of(previous)
    ran = [words[0]] if words and ref.search(words[0]) else []
    if _runs_argument(prog, words[1:]):
        ran += [a for a in words[1:] if ref.search(a)]
    if stdin and ref.search(stdin) and _reads_program_from_stdin(prog, words[1:]):
        ran.append(stdin)
    for word in ran[:1]:
        yield OBFUSCATED_CODE, word


# A one-liner that decodes what it prints (``perl -e 'print pack("H*", "6375726c")'``, ``python3 -c
# "print(bytes.fromhex(…).decode())"``, ``node -e "…Buffer.from(s, 'base64')…"``), read as a decoder.
_CODE_DECODES = re.compile(
    r"\b(?:pack|unpack|decode_base64|decode64|unpack1|b64decode|b32decode|b16decode|b85decode|a85decode"
    r"|unhexlify|fromhex|decompress|fromCharCode|atob|chr|reverse|rot13|hex2bin|base64_decode|gzinflate"
    r"|str_rot13|strrev)\b|\bBuffer\.from\b|\[\s*::\s*-1\s*\]|\\x[0-9a-fA-F]{2}"
)
# ``python -m base64 -d``, ``python -m gzip -d``: the standard library's decoders run as programs.
_PYTHON_DECODER_MODULES = wordlist("base64 binascii gzip zlib bz2 lzma uu quopri codecs zipfile tarfile")


def _decodes(prog: str, args: list[str]) -> bool:
    if prog in _ALWAYS_DECODES:
        return True
    if prog == "printf":
        return bool(args) and bool(_PRINTF_ESCAPES.search(args[0]))
    if prog == "echo":  # ``echo -e '\x63\x75\x72\x6c x'``
        flags = [a for a in args if re.fullmatch(r"-[neE]+", a)]
        return any("e" in f for f in flags) and any(_PRINTF_ESCAPES.search(a) for a in args)
    if _PYTHON_EXE.match(prog):
        for i, arg in enumerate(args):
            if arg == "-m" and i + 1 < len(args):
                return args[i + 1] in _PYTHON_DECODER_MODULES
            if re.fullmatch(r"-[A-Za-z]*c", arg) and i + 1 < len(args):
                return bool(_CODE_DECODES.search(args[i + 1]))
        return False
    if prog in _CODE_FLAG:
        flag = _CODE_FLAG[prog]
        for i, arg in enumerate(args):
            if (arg == flag or re.fullmatch(rf"-[A-Za-z]*{flag[1]}", arg)) and i + 1 < len(args):
                return bool(_CODE_DECODES.search(args[i + 1]))
        return False
    if prog == "openssl":
        return bool(args) and args[0] in ("enc", "base64") and "-d" in args
    if prog not in _DECODE_FLAGS:
        return False
    long_flags, letters = _DECODE_FLAGS[prog]
    return any(
        a in long_flags or (re.fullmatch(r"-[A-Za-z]+", a) is not None and bool(set(a[1:]) & set(letters)))
        for a in args
    )


def _reads_program_from_stdin(prog: str, args: list[str]) -> bool:
    """Whether ``prog args`` takes its program from stdin (``sh``, ``python -``, ``perl``, ...)."""
    if _PYTHON_EXE.match(prog):
        code_flags = [a for a in args if re.fullmatch(r"-[A-Za-z]*[cm]", a)]
        positional = positional_args(args, {"-W", "-X"})[0]
        return not code_flags and (not positional or positional[0] == "-")
    if prog in _INTERPRETERS:
        if any(re.fullmatch(r"-[A-Za-z]*[ceEr]", a) for a in args):
            return False  # -c/-e/-r: the program is an argument; stdin is data
        positional = positional_args(args, {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})[0]
        return not positional or positional[0] in ("-", "/dev/stdin") or "-s" in args
    return prog in ("source", ".") and bool(args) and args[0] in ("/dev/stdin", "-")


def _runs_argument(prog: str, args: list[str]) -> bool:
    """Whether ``prog`` runs one of its arguments as a program (``eval``, ``bash -c``, ``python -c``)."""
    if prog == "eval":
        return True
    if _PYTHON_EXE.match(prog):
        return any(re.fullmatch(r"-[A-Za-z]*c", a) for a in args)
    if prog in _INTERPRETERS:
        flag = _CODE_FLAG.get(prog, "-c")
        return any(a == flag or re.fullmatch(rf"-[A-Za-z]*{flag[1]}", a) for a in args)
    return False
