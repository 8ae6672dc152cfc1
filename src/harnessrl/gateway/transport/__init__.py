"""HTTP transport: the gateway's connections, under uvicorn.

uvicorn alone (0.54) has one connection timer, the keep-alive timeout, and arms it only after a
response: a connection that opens and never sends a whole request is held forever, so a few
hundred of them exhaust the process's file descriptors and lock every other client out. Its 5 s
keep-alive default also equals the idle time after which httpx and the OpenAI SDK stop reusing a
connection, so a client sometimes sends its next call on a connection the server is closing at
that instant, and gets a ``ReadError`` for a call that was never recorded.

- ``protocol``: ``GatewayProtocol``, uvicorn's httptools protocol with read timeouts, a keep-alive
  longer than clients keep theirs, a cap on open connections, and the client as routes see it.
- ``client``: ``ClientSide``, a connection's client as routes see it (``delivery.ClientConnection``).
- ``answer_head``: ``HeldHead``, which sends a whole answer's head and body in one write.
- ``serving``: ``uvicorn_config``, which serves an app with that protocol and these settings.
- ``limits``: the connection settings (``ConnectionLimits``) and the open-file limit they need.
- ``refusals``: the answers written straight to the socket when no route answers (408, 431, 503).
- ``heads``: request heads the HTTP parser would mishandle (Upgrade), and what a socket has not
  delivered yet.
"""
