"""Pool: a stream iterated outside async with is refused, load() gives LoadInfo; real sidecars."""

from __future__ import annotations

import anyio
import pytest

from indextts_client import LoadInfo, Pool

pytestmark = pytest.mark.anyio


async def test_a_pool_stream_outside_async_with_is_refused_not_silently_empty() -> None:
    with anyio.fail_after(30):
        async with Pool("fake", size=1) as pool:
            with pytest.raises(RuntimeError, match=r"inside 'async with pool\.stream"):
                async for _chunk in pool.stream("abc"):
                    pass
            infos = await pool.load()
            assert [(type(info), info.loaded) for info in infos] == [(LoadInfo, True)]
