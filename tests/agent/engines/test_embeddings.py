"""The embeddings engine (:mod:`agent.engines.embeddings`): 401 without its key, health open."""

from __future__ import annotations

from pathlib import Path

from agent import models


async def test_the_embeddings_engine_answers_401_without_its_key_health_stays_open(tmp_path: Path) -> None:
    """The real engine (the shipped all-MiniLM-L6-v2) as an ASGI app: ``/v1`` needs the key, in
    OpenAI's error shape as vLLM's routes would need it; ``/health`` does not."""
    import httpx

    from agent.engines.embeddings import create_app

    model = models.resolve("all-MiniLM-L6-v2", tmp_path, cache=tmp_path / "cache")
    app = create_app(model.path, "minilm", api_key="right-key")
    body = {"model": "minilm", "input": ["hello world"]}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        assert (await http.get("/health")).status_code == 200
        for headers in (
            {},
            {"authorization": "Bearer wrong-key"},
            {"authorization": "Bearer right-key-and-more"},
            {"authorization": "Basic right-key"},
            {"authorization": "right-key"},
        ):
            for method, path in (("POST", "/v1/embeddings"), ("GET", "/v1/models"), ("GET", "/v1/nothing")):
                refused = await http.request(method, path, json=body, headers=headers)
                assert refused.status_code == 401, (headers, path)
                error = refused.json()["error"]
                assert error["code"] == "invalid_api_key" and error["message"], error
                assert set(error) == {"message", "type", "param", "code"}
        ok = await http.post("/v1/embeddings", json=body, headers={"authorization": "Bearer right-key"})
        assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384
        listed = await http.get("/v1/models", headers={"authorization": "bearer right-key"})
        assert [m["id"] for m in listed.json()["data"]] == ["minilm"]
