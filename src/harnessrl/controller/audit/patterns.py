"""What the ``git_history``, ``network_fetch`` and ``python_network`` rules look for, as data: the
network programs, git's subcommands and revision syntax, the settings git runs as commands, and the
regular expressions matched in Python text (network, git and install use). ``audit.rules`` walks
commands and code and looks them up here.
"""

from __future__ import annotations

import re

from harnessrl.controller.audit.changes import PACKAGE_INSTALL
from harnessrl.controller.audit.shell import wordlist

GIT_HISTORY = "git_history"  # git log/show/blame/reflog/..., other commits, .git/ objects, fetch/pull
NETWORK_FETCH = "network_fetch"  # curl, wget, nc, ssh/scp, /dev/tcp/
PYTHON_NETWORK = "python_network"  # urllib.request, requests, httpx, aiohttp, socket, http.client, ftplib

NETWORK_PROGRAMS = wordlist(
    "curl wget nc ncat netcat socat ssh scp sftp telnet ftp aria2c lynx w3m links httpie http https xh"
)

# Programs that copy, archive or link a folder: given ``.git`` itself, they take the history out of
# the workspace, where ``cat packed-refs`` or zlib-reading ``objects/`` names no ``.git`` path.
COPIERS = wordlist("cp mv rsync tar gtar bsdtar zip 7z 7za cpio ln scp install pax")
COPIER_VALUE_OPTS = set(wordlist("--exclude --exclude-from --include --include-from -X -x --filter -t -T"))

# The network libraries an ``EMBEDDING_PROGRAMS`` one-liner loads are network fetches (the shell
# commands it runs are analysed as shell).
EMBEDDED_NETWORK = re.compile(
    r"\b(?:IO::Socket|LWP::\w+|HTTP::Tiny|Net::HTTP|Net::FTP|TCPSocket|open-uri|Socket\.tcp)\b"
    r"|\brequire\(\s*['\"](?:node:)?(?:https?|http2|net|dgram|tls)['\"]\s*\)|/inet/tcp/"
    # node's global ``fetch``, PHP's URL wrappers and sockets, Lua's LuaSocket
    r"|(?<![\w.>$:])fetch\s*\("
    r"|\b(?:file_get_contents|fopen|file|copy|readfile)\(\s*['\"](?:https?|ftps?)://"
    r"|\b(?:fsockopen|pfsockopen|stream_socket_client|curl_init)\s*\("
    r"|\brequire\s*\(?\s*['\"]socket(?:\.\w+)?['\"]"
)

# git

GIT_GLOBAL_WITH_VALUE = wordlist("-C -c --git-dir --work-tree --namespace --exec-path --config-env")
# Always history (or upstream) access, whatever the arguments.
GIT_ALWAYS = wordlist(
    "log show reflog blame annotate rev-list cat-file fetch pull clone whatchanged shortlog ls-remote"
    " show-branch fsck unpack-objects verify-pack bisect format-patch fast-export bundle diff-tree"
    " revert cherry-pick"
)
# Never history access; everything else (diff, checkout, restore, reset, grep, ls-tree, archive, ...)
# is flagged only when an argument names another commit.
GIT_SAFE = wordlist(
    "status add commit init config stash ls-files branch help version clean check-ignore remote"
    " --version --help"
)
REVISION = re.compile(
    # HEAD~1, main^, @{1}, HEAD~2:path, @~ (HEAD~), HEAD^! / HEAD^@ / HEAD^- (a commit against its parents)
    r"^[\w./@-]*(?:~\d*|\^\d*|\^[!@]|\^-\d*|@\{[^}]*\})+(?::.*)?$"
    r"|^(?:ORIG_HEAD|FETCH_HEAD|MERGE_HEAD)\b|^[0-9a-f]{7,40}(?::.*)?$|\.\.|^(?:origin|upstream)/|^refs/"
    r"|^--source|^--detach$"
)


# Settings whose value git runs as a command (``git -c core.fsmonitor='curl x' status``); an alias is
# one too (``alias.x=!curl …`` runs the shell, ``alias.x=log`` a git subcommand).
GIT_COMMAND_SETTINGS = wordlist(
    "core.pager core.editor core.sshcommand core.fsmonitor core.askpass diff.external sequence.editor"
    " pager.log pager.show pager.diff"
)

# Python

NET_MODULES = (
    r"(?:_?socket|requests|httpx|aiohttp|urllib3|urllib\.request|http\.client|ftplib|telnetlib|pycurl"
    r"|paramiko|websockets?|smtplib|xmlrpc\.client|pip\._vendor\.(?:requests|urllib3))"
)
PYTHON_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    (
        PYTHON_NETWORK,
        re.compile(rf"\bimport[ \t]+(?:[\w.]+(?:[ \t]+as[ \t]+\w+)?[ \t]*,[ \t]*)*{NET_MODULES}\b"),
    ),
    (PYTHON_NETWORK, re.compile(rf"\bfrom[ \t]+{NET_MODULES}(?:\.\w+)*[ \t]+import\b")),
    (
        PYTHON_NETWORK,
        re.compile(
            r"\bfrom[ \t]+urllib[ \t]+import[ \t][^\n;]*\brequest\b"
            r"|\bfrom[ \t]+http[ \t]+import[ \t][^\n;]*\bclient\b"
        ),
    ),
    (PYTHON_NETWORK, re.compile(rf"\b(?:__import__|import_module)\(\s*['\"]{NET_MODULES}['\"]")),
    (
        PYTHON_NETWORK,
        re.compile(
            r"\burllib\.request\.\w+|\b(?:requests|httpx)\.(?:get|post|put|head|delete"
            r"|patch|request|stream|Client|AsyncClient|Session)\b|\bsocket\.(?:socket"
            r"|create_connection)\b"
        ),
    ),
    (
        PYTHON_NETWORK,
        re.compile(
            r"\bfrom[ \t]+pip\._vendor[ \t]+import[ \t][^\n;]*\b(?:requests|urllib3)\b"
            # multiprocessing's sockets (its ``wait`` for process sentinels is not network)
            r"|\bmultiprocessing\.connection\.(?:Client|Listener)\b"
            r"|\bfrom[ \t]+multiprocessing\.connection[ \t]+import[ \t][^\n;]*\b(?:Client|Listener)\b"
            # asyncio's streams and event-loop transports; not any method that happens to share the name
            r"|\basyncio\.open_(?:unix_)?connection\b|\bfrom[ \t]+asyncio[ \t]+import[ \t][^\n;]*\bopen_connection\b"
            r"|\b(?:loop|get_event_loop\(\)|get_running_loop\(\)|new_event_loop\(\))"
            r"\.create_(?:connection|datagram_endpoint)\s*\("
        ),
    ),
    (
        GIT_HISTORY,
        re.compile(
            r"\bimport[ \t]+(?:git|pygit2|dulwich)\b|\bfrom[ \t]+(?:git|pygit2|dulwich)"
            r"(?:\.\w+)*[ \t]+import\b"
            # os.path.join('.git', 'objects'), Path('.git') / 'refs': the history, spelled in pieces
            r"|['\"]\.git['\"]\s*\)?\s*[,/]\s*['\"](?:objects|refs|logs|packed-refs|ORIG_HEAD|FETCH_HEAD|COMMIT_EDITMSG)\b"
            # the .git folder listed, walked or copied whole: glob.glob('.git/**'), os.walk('.git'),
            # Path('.git').rglob('*'), shutil.copytree('.git', …), os.symlink('.git', 'g') (linked or moved
            # out, its files are read under a name without .git; ``os.path.isdir('.git')`` only asks)
            r"|\b(?:walk|fwalk|listdir|scandir|glob|iglob|copytree|symlink|link|rename|move)\(\s*[rbuf]{0,2}(['\"])(?:[^'\"\n]*/)?\.git(?:/[^'\"\n]*)?\1"
            r"|\bPath\(\s*[rbuf]{0,2}(['\"])(?:[^'\"\n]*/)?\.git/?\2\s*\)\s*\.(?:rglob|glob|iterdir|walk)\("
        ),
    ),
    (
        PACKAGE_INSTALL,
        re.compile(r"\bpip\.main\(|\bpip\._internal\b|^[ \t]*%(?:pip|conda)[ \t]+install\b", re.M),
    ),
]

# Installers and network clients that also run as ``python -m NAME``: read as the program NAME.
MODULE_PROGRAMS = frozenset(
    {"uv", "pipx", "poetry", "pdm", "pipenv", "hatch", "conda", "mamba", "httpie", "wget"}
)
