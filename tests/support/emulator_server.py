"""The emulated API server's HTTP side (tests/support/cluster_emulator.py): kmock's server for it, with
every request's JSON body decoded by orjson.

kmock decodes each request's body with aiohttp's `BaseRequest.json`, the standard library's decoder;
with the emulator's writes answered directly, that decoding was a fifth of the emulator's time while
an operator created 25,000 pods (py-spy on benchmarks/operator_scale.py). The emulator is the stand-in
for an API server that runs on machines of its own: what it spends on this machine's two cores is
taken from the operator it measures. The same answers, the same errors (orjson's decode error is a
`ValueError`, which kmock takes for a body that is not JSON).
"""

from __future__ import annotations

from typing import Any

import aiohttp.test_utils
import aiohttp.web
import aiohttp.web_runner
import aiohttp.web_server
import orjson
from kmock._internal.apps import RawHandler, Server


class _Request(aiohttp.web.BaseRequest):
    async def json(self, *, loads: Any = orjson.loads) -> Any:
        return await super().json(loads=loads)


class _HttpServer(aiohttp.web_server.Server):  # type: ignore[type-arg]
    def _make_request(self, *args: Any) -> aiohttp.web.BaseRequest:
        return _Request(*args, self._loop)


class _TestServer(aiohttp.test_utils.RawTestServer):
    """aiohttp's raw test server (kmock's default), serving through `_HttpServer`."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> aiohttp.web_runner.ServerRunner:
        server = _HttpServer(self._handler, loop=self._loop, debug=debug, **kwargs)
        return aiohttp.web_runner.ServerRunner(server, debug=debug, **kwargs)


def serving(emulator: RawHandler) -> Server:
    """The server of `emulator`: enter it (`async with`) to listen on a free loopback port."""
    return Server(emulator, server_cls=_TestServer)
