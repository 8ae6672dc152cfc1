"""How the audit's rules read Python code: as Python runs it, and the paths its string literals make.

``python_names_normalized`` spells identifiers as Python reads them (NFKC, PEP 3131), and
``builtin_aliases_called`` spells calls of names bound to ``exec``/``eval``/``__import__`` as calls
of the builtin, so the patterns of ``audit.patterns`` match what runs, not what was typed.
``literal_path_hints`` flags string literals, alone or joined with ``+``, that name git's history or
a raw network address. ``audit.rules.analyze_python`` applies them; see docs/audit.md.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

from harnessrl.controller.audit.git_folder import git_history_path
from harnessrl.controller.audit.hints import RAW_PATTERNS
from harnessrl.controller.audit.obfuscation import string_literals
from harnessrl.controller.audit.patterns import GIT_HISTORY, NETWORK_FETCH

_WORD = re.compile(r"\w+")


def python_names_normalized(code: str) -> str:
    """``code`` with its words as Python reads them: identifiers are NFKC-normalized (PEP 3131), so
    ``import ｓｏｃｋｅｔ``, ``os.ｓｙｓｔｅｍ(…)``, ``𝐞𝐱𝐞𝐜(…)`` and ``def __ｅｑ__`` run as the plain
    names, which no rule read. Words in strings are normalized too (over-reading only flags more)."""
    if code.isascii():
        return code
    return _WORD.sub(
        lambda m: m.group() if m.group().isascii() else unicodedata.normalize("NFKC", m.group()), code
    )


# ``e = exec`` then ``e("…")``, ``imp = importlib.import_module`` then ``imp("socket")``: a builtin that
# runs code or imports, bound to another name. Its calls are read as calls of the builtin itself.
_BUILTIN_ALIAS = re.compile(
    r"^[ \t]*([A-Za-z_]\w*)[ \t]*=[ \t]*(?:builtins\.|__builtins__\.)?"
    r"(exec|eval|compile|__import__|(?:importlib\.)?import_module)[ \t]*(?:#.*)?$",
    re.M,
)
# String literals joined with ``+`` (``'.git/' + 'packed-refs'``): the text they make is read for the
# raw patterns, as the typed text is.
_PY_STRING_PIECE = r"[rbu]{0,2}(?:'[^'\n]*'|\"[^\"\n]*\")"
_PY_JOINED_LITERALS = re.compile(rf"{_PY_STRING_PIECE}(?:\s*\+\s*{_PY_STRING_PIECE})+")
# A string literal: the path it may name in the .git folder is for ``audit.git_folder`` to say.
_PY_STRING_LITERAL = re.compile(r"""(['"])([^'"\n]*)\1""")


def builtin_aliases_called(code: str) -> str:
    """``code`` with the calls of names bound to ``exec``/``eval``/``compile``/``__import__``/
    ``import_module`` spelled as calls of the builtin (``e = exec; e("import socket")``)."""
    aliases = {name: target for name, target in _BUILTIN_ALIAS.findall(code) if name != target}
    if not aliases:
        return code
    calls = re.compile(rf"(?<![\w.])({'|'.join(map(re.escape, aliases))})(?=\s*\()")
    return calls.sub(lambda m: aliases[m.group(1)], code)


def literal_path_hints(code: str) -> Iterator[tuple[str, str]]:
    """``(rule, hint)`` for the string literals of ``code`` that name git's history or a raw network
    address: joined with ``+`` (``open('.git/' + 'packed-refs')``), or alone (``open('.git//packed-refs')``,
    ``glob('.gi?/logs/*')``)."""
    for match in _PY_JOINED_LITERALS.finditer(code):  # open('.git/' + 'packed-refs'): the path it makes
        joined = "".join(string_literals(match.group(0)))
        if raw := RAW_PATTERNS.search(joined):
            yield (NETWORK_FETCH if raw.group("tcp") else GIT_HISTORY), match.group(0)
        elif git_history_path(joined):  # glob.glob('.gi' + 't/obj*/*/*')
            yield GIT_HISTORY, match.group(0)
    for match in _PY_STRING_LITERAL.finditer(code):  # open('.git//packed-refs'), glob('.gi?/logs/*')
        if ".g" in match.group(2) and git_history_path(match.group(2)):
            yield GIT_HISTORY, match.group(0)
