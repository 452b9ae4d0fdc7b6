"""The fake engine validates what real engines validate, so tests of the client meet real refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from client_support import expected, fake_client

from indextts_client import EngineError, InvalidRequestError

pytestmark = pytest.mark.anyio


async def test_the_fake_engine_rejects_what_real_engines_reject(tmp_path: Path) -> None:
    clip = tmp_path / "speaker.wav"
    clip.write_bytes(b"RIFF a stand-in clip")
    nan = float("nan")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"text": ""}, "$.text", "text is empty"),
        ({"text": " \n\t"}, "$.text", "text is empty"),
        ({"emotion": {"happy": 5.0}}, "$.emotion.happy", "must be in [0, 1], got 5.0"),
        ({"emotion": {"sad": -1.0}}, "$.emotion.sad", "must be in [0, 1], got -1.0"),
        ({"emotion": {"calm": nan}}, "$.emotion.calm", "got nan"),
        ({"emotion": {"happy": 0.7, "sad": 0.7}}, "$.emotion", "sum to 1.4"),
        ({"emotion": {"happy": 0.5, "alpha": nan}}, "$.emotion.alpha", "got nan"),
        ({"voice": str(tmp_path / "nobody.wav")}, "$.voice", "does not exist"),
        ({"emotion": {"kind": "audio", "path": str(tmp_path)}}, "$.emotion.path", "is a directory"),
    ]
    with anyio.fail_after(30):
        async with fake_client() as client:
            for kwargs, field, fragment in cases:
                text = kwargs.pop("text", "x")
                with pytest.raises(InvalidRequestError) as caught:
                    await client.synthesize(text, **kwargs)
                assert caught.value.code == "invalid_input", kwargs
                assert caught.value.detail["field"] == field and fragment in caught.value.message, caught.value
            audio = await client.synthesize("ok", voice=str(clip), emotion={"happy": 0.6, "calm": 0.4})
            assert audio.samples.tobytes() == expected("ok")
        # validate=false: the old, permissive double, with its fault injection.
        async with fake_client(engine_options={"validate": False}) as client:
            permissive = await client.synthesize("", voice="anything", emotion={"happy": 5.0})
            assert permissive.samples.tobytes() == expected("")  # empty text renders one blank's tone
            with pytest.raises(EngineError) as failed:
                await client.synthesize("", fail_at=0)
            assert failed.value.code == "engine_error"
