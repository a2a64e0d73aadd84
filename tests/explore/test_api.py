"""The explorer's JSON API: every panel's numbers equal what the library computes on the same text,
long analyses stream their progress and can be cancelled, and the server is safe by default
(token, Host and Origin checks, JSON only, bounded inputs, no model opened from the page)."""

from __future__ import annotations

import json

import pytest
import torch

import anatomy
from anatomy.explore.server import PAGE_POLICY
from explore_servers import TOKEN, post

TEXT = "Hello World, this is"


def model(name):
    return anatomy.from_pretrained(name)


# ---- the two fixed points -----------------------------------------------------------------------


def test_models_lists_what_was_given_without_loading_it(client):
    data = client.get("/api/models").json()
    assert [m["name"] for m in data["models"]][:3] == ["toy", "toy-encoder", "toy-seq2seq"]
    toy = data["models"][0]
    assert (toy["arch"], toy["n_layers"], toy["n_heads"], toy["d_model"]) == ("decoder", 2, 2, 4)
    assert data["allow_open"] is False


def test_run_returns_the_tokens_and_the_next_token_distribution_of_run_with_cache(client):
    data = post(client, "/api/run", model="toy", text=TEXT)
    toy = model("toy")
    output, cache = anatomy.run_with_cache(toy, TEXT)
    assert data["tokens"] == cache.tokens[0] == ["<SOS>", "Hello", "World,", "this", "is"]
    assert data["ids"] == toy.tokenizer.encode_prompt(TEXT)
    probs = torch.softmax(output.logits[0, -1], dim=-1)
    top = probs.topk(len(data["next"]))
    assert [row["id"] for row in data["next"]] == top.indices.tolist()
    assert [row["token"] for row in data["next"]][0] == "Alejandro!"
    torch.testing.assert_close(torch.tensor([row["prob"] for row in data["next"]]), top.values, atol=1e-6, rtol=0)


def test_sampling_settings_show_what_the_sampler_keeps(client):
    data = post(client, "/api/run", model="toy", text=TEXT, temperature=0.5, top_k=3)["distribution"]
    assert data["kept"] == 3 and [row["kept"] for row in data["next"]][:4] == [True, True, True, False]
    logits = anatomy.run_with_cache(model("toy"), TEXT)[0].logits[0, -1]
    expected = anatomy.generation.sampling.sampling_distribution(logits[None], 0.5, 3, None)[0]
    for row in data["next"]:
        assert row["sample_prob"] == pytest.approx(float(expected[row["id"]]), abs=1e-6)
    assert client.post("/api/run", json={"model": "toy", "text": TEXT, "temperature": -1}).status_code == 400


def test_an_encoder_shows_its_masked_word_and_an_encoder_decoder_translates(client):
    masked = post(client, "/api/run", model="toy-encoder", text="Hello World, this <MASK> Alejandro!")
    assert masked["distribution"]["position"] == 4 and masked["next"][0]["token"] == "is"
    translated = post(client, "/api/run", model="toy-seq2seq", text="Hello World, this is Alejandro!")
    assert translated["translated"] and translated["target"] == "Hola Mundo, soy Alejandro!"
    assert translated["source"]["tokens"][0] == "<SOS>" and translated["tokens"][0] == "<SOS>"
    given = post(client, "/api/run", model="toy-seq2seq", text="Hello World, this is Alejandro!", target_text="Hola")
    assert not given["translated"] and given["tokens"] == ["<SOS>", "Hola"] and given["next"][0]["token"] == "Mundo,"


# ---- the panels: the numbers are the library's ---------------------------------------------------


def test_attention_is_the_traced_pattern_one_layer_at_a_time(client):
    data = post(client, "/api/attention", model="toy", text=TEXT, layer=1, head=0, query=3)
    _, cache = anatomy.run_with_cache(model("toy"), TEXT)
    pattern = cache["blocks.1.attn.pattern"][0]  # (H, T, T)
    torch.testing.assert_close(torch.tensor(data["weights"]), pattern, atol=1e-4, rtol=0)
    neuron = data["neuron"]
    torch.testing.assert_close(torch.tensor(neuron["weights"]), pattern[0, 3], atol=1e-5, rtol=0)
    q, k = cache["blocks.1.attn.q"][0, 0, 3], cache["blocks.1.attn.k"][0, 0]
    torch.testing.assert_close(torch.tensor(neuron["scores"]), k @ q / 2 ** 0.5, atol=1e-4, rtol=1e-4)
    seq2seq = post(client, "/api/attention", model="toy-seq2seq", text="Hello World,", target_text="Hola Mundo,", map=2)
    assert [m["name"] for m in seq2seq["maps"]][2] == "cross-attention"
    assert len(seq2seq["weights"][0]) == 3 and len(seq2seq["weights"][0][0]) == 4  # 3 target x 4 source tokens


def test_the_lens_is_the_logit_lens(client):
    data = post(client, "/api/lens", model="toy", text=TEXT, top=2)
    lens = anatomy.logit_lens(model("toy"), TEXT, top=2)
    assert data["rows"] == lens.labels["layer"] and data["cols"] == lens.tokens[0]
    assert data["tokens"] == [layer[0] for layer in lens.extra["top_tokens"]]
    torch.testing.assert_close(torch.tensor(data["probs"]), lens.extra["top_probs"][:, 0], atol=1e-4, rtol=0)
    assert "max |diff|" in data["check"] and data["error"] < 1e-5


def test_attribution_bars_sum_to_the_logit(client, prenorm):
    refused = client.post("/api/attribution", json={"model": "toy", "text": TEXT, "method": "dla"})
    assert refused.status_code == 400 and "pre-norm" in refused.json()["error"]  # the paper's post-norm toy
    data = post(client, "/api/attribution", model=prenorm, text=TEXT, method="dla")
    dla = anatomy.direct_logit_attribution(model(prenorm), TEXT, data["target_id"])
    logit = anatomy.run_with_cache(model(prenorm), TEXT)[0].logits[0, -1, data["target_id"]]
    assert sum(bar["value"] for bar in data["bars"]) == pytest.approx(float(logit), abs=1e-4)
    assert data["total"] == pytest.approx(float(dla.values[:, 0, -1].sum()), abs=1e-5)
    shown = sorted(dla.values[:, 0, -1].abs().tolist(), reverse=True)[:len(data["bars"])]
    assert [abs(b["value"]) for b in data["bars"] if not b.get("rest")] == pytest.approx(shown[:len(data["bars"]) - 1]
                                                                                   if data["bars"][-1].get("rest") else shown)
    gxi = post(client, "/api/attribution", model="toy", text=TEXT, method="gxi", target="Alejandro!")
    expected = anatomy.gradient_x_input(model("toy"), TEXT, data["target_id"], position=4).values[0]
    torch.testing.assert_close(torch.tensor(gxi["values"]), expected, atol=1e-4, rtol=1e-4)
    rollout = post(client, "/api/attribution", model="toy", text=TEXT, method="rollout")
    assert sum(rollout["values"]) == pytest.approx(1.0, abs=1e-4)


def test_intervening_on_a_head_equals_the_trace_intervention(client):
    data = post(client, "/api/intervene", model="toy", text=TEXT, kind="head", layer=1, index=1, scale=0.0)
    toy = model("toy")

    def zero(x):
        x = x.clone()
        x[:, :, 1] = 0
        return x

    with torch.no_grad(), anatomy.trace(toy, [], interventions={"blocks.1.attn.z": zero}):
        after = torch.softmax(toy(torch.tensor([toy.tokenizer.encode_prompt(TEXT)])).logits[0, -1], dim=-1)
    for row in data["rows"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=1e-6)
    neuron = post(client, "/api/intervene", model="toy", text=TEXT, kind="neuron", layer=0, index=5, scale=2.0)
    assert neuron["point"] == "blocks.0.mlp.post"  # neuron 5 fires on this text (neuron 3 is silent)

    def double(x):
        x = x.clone()
        x[:, :, 5] = 2 * x[:, :, 5]
        return x

    ids = torch.tensor([toy.tokenizer.encode_prompt(TEXT)])
    with torch.no_grad():
        before = torch.softmax(toy(ids).logits[0, -1].double(), dim=-1)
        with anatomy.trace(toy, [], interventions={"blocks.0.mlp.post": double}):
            after = torch.softmax(toy(ids).logits[0, -1].double(), dim=-1)
    for row in neuron["rows"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=1e-6)
    kl = float((before * (before.log() - after.log())).sum())  # KL(before || after)
    assert kl > 1e-4 and neuron["kl"] == pytest.approx(kl, rel=1e-5)


def test_the_walk_panel_is_the_walk(client):
    data = post(client, "/api/walk", model="toy", text=TEXT, layer=1, head=1, row=2, open=[4])
    assert data["ok"] and (data["layer"], data["head"], data["row"]) == (1, 1, 2)
    walk = anatomy.walkthrough(*anatomy.walk.toy_example()[:2], **{**anatomy.walk.toy_example()[2], "layer": 1, "head": 1})
    assert [s["title"] for s in data["steps"]][:5] == walk.titles[:5]
    assert "<math" in data["steps"][3]["html"] and "<script" not in data["steps"][3]["html"]
    assert all(s["html"] is None for s in data["steps"] if s["number"] != 4)  # HTML for the steps opened only


def test_compare_two_texts_on_one_model(client):
    data = post(client, "/api/compare", model="toy", text=TEXT, text_b="Hello World, this")
    first, second = data["sides"]
    assert first["distribution"]["next"][0]["token"] == "Alejandro!" and second["distribution"]["next"][0]["token"] == "is"
    (_, a), (_, b) = (anatomy.run_with_cache(model("toy"), text) for text in (TEXT, "Hello World, this"))
    p, q = (torch.softmax(cache["logits"][0, -1].double(), dim=-1) for cache in (a, b))
    assert data["kl"] == pytest.approx(float((p * (p.log() - q.log())).sum()), rel=1e-5)  # KL(first || second)
    assert [row["layer"] for row in data["divergence"]] == [0, 1]
    for row in data["divergence"]:
        x, y = (cache[f"blocks.{row['layer']}.resid_post"][0, -1].double() for cache in (a, b))
        assert row["relative"] == pytest.approx(float((x - y).norm() / x.norm()), rel=1e-5)
        assert row["cosine"] == pytest.approx(float(torch.nn.functional.cosine_similarity(x, y, dim=0)), rel=1e-5)


# ---- jobs: progress, results, cancelling ---------------------------------------------------------


def events(client, job_id):
    with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    return [(block.split("\n")[0][len("event: "):], json.loads(block.split("\n")[1][len("data: "):]))
            for block in text.strip().split("\n\n")]


def test_patching_runs_as_a_job_and_equals_patch(client):
    clean, corrupt = "Hello World, this is", "Hello World, is this"
    job = client.post("/api/jobs", json={"model": "toy", "text": clean, "kind": "patch", "corrupt": corrupt})
    assert job.status_code == 202
    stream = events(client, job.json()["id"])
    assert stream[-1][0] == "result" and all(kind == "progress" for kind, _ in stream[:-1])
    result = stream[-1][1]["result"]
    expected = anatomy.patch(model("toy"), clean, corrupt)
    torch.testing.assert_close(torch.tensor(result["values"]), expected.values, atol=1e-5, rtol=1e-4)  # 5 digits
    assert result["cols"] == expected.tokens[0] and result["clean"] > result["corrupt"]
    unequal = client.post("/api/jobs", json={"model": "toy", "text": clean, "kind": "patch", "corrupt": "Hello"})
    assert unequal.status_code == 400 and "as many tokens" in unequal.json()["error"]


def test_integrated_gradients_and_heads_run_as_jobs(client):
    job = client.post("/api/jobs", json={"model": "toy", "text": TEXT, "kind": "ig"}).json()
    kind, last = events(client, job["id"])[-1]
    assert kind == "result" and last["result"]["converged"] and len(last["result"]["values"]) == 5
    heads = client.post("/api/jobs", json={"model": "toy", "kind": "heads"}).json()
    kind, last = events(client, heads["id"])[-1]
    scores = anatomy.detect_heads(model("toy"), "induction").values
    torch.testing.assert_close(torch.tensor(last["result"]["scores"]["induction"]["values"]), scores, atol=1e-4, rtol=0)


# ---- safe by default ----------------------------------------------------------------------------


def test_every_call_needs_the_token(client):
    for headers in ({"Authorization": "Bearer wrong"}, {"Authorization": ""}):
        assert client.get("/api/models", headers=headers).status_code == 401
    assert client.get(f"/api/models?token={TOKEN}", headers={"Authorization": ""}).status_code == 200
    assert client.get("/", headers={"Authorization": ""}).status_code == 401
    assert client.get("/static/core.js", headers={"Authorization": ""}).status_code == 200  # code, no data


def test_a_foreign_host_or_origin_is_refused(client):
    assert client.get("/api/models", headers={"Host": "evil.example"}).status_code == 403  # DNS rebinding
    assert client.get("/api/models", headers={"Host": "localhost:8765"}).status_code == 403  # another port
    assert client.get("/api/models", headers={"Host": "localhost"}).status_code == 200  # this one's, 80
    assert client.post("/api/run", json={"model": "toy", "text": "x"},
                       headers={"Origin": "http://evil.example"}).status_code == 403
    assert client.post("/api/run", json={"model": "toy", "text": "x"},
                       headers={"Origin": "http://testserver"}).status_code == 200


def test_inputs_are_bounded_and_json_only(client):
    assert client.post("/api/run", content=b"model=toy", headers={"Content-Type": "application/x-www-form-urlencoded"}).status_code == 415
    assert client.post("/api/run", json={"model": "toy", "text": "x" * 70000}).status_code == 413
    long_text = " ".join(["Hello"] * 300)
    response = client.post("/api/run", json={"model": "toy", "text": long_text})
    assert response.status_code == 413 and "at most" in response.json()["error"]
    assert client.post("/api/run", json=["not", "an", "object"]).status_code == 400
    assert client.post("/api/walk", json={"model": "toy", "text": TEXT, "layer": 7}).status_code == 400


def test_no_path_or_hub_id_is_opened_from_the_page(client, tmp_path):
    response = client.post("/api/run", json={"model": str(tmp_path), "text": "x"})
    assert response.status_code == 403 and "--allow-open" in response.json()["error"]
    assert client.post("/api/open", json={"model": "someone/something"}).status_code == 403


def test_the_page_allows_nothing_but_its_own_origin(client):
    page = client.get("/")
    assert page.headers["content-security-policy"] == PAGE_POLICY
    assert "default-src 'self'" in PAGE_POLICY and "http" not in PAGE_POLICY
    for name in ("main.js", "core.js", "explore.css"):
        assert "http://" not in client.get(f"/static/{name}").text and "https://" not in client.get(f"/static/{name}").text


def test_exports_are_the_library_pages_a_png_and_the_json(client):
    base = {"model": "toy", "text": TEXT, "token": TOKEN}
    html = client.get("/api/export", params={**base, "panel": "lens", "format": "html"})
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in html.headers["content-security-policy"] and "Logit lens" in html.text
    png = client.get("/api/export", params={**base, "panel": "attention", "format": "png"})
    assert png.content[:8] == b"\x89PNG\r\n\x1a\n"
    data = client.get("/api/export", params={**base, "panel": "lens", "format": "json"}).json()
    assert data["cols"] == ["<SOS>", "Hello", "World,", "this", "is"]
    view = client.get("/api/export", params={**base, "panel": "attention", "format": "html", "view": "model"})
    assert "Every layer and head" in view.text


# ---- features ------------------------------------------------------------------------------------


def test_the_features_are_the_saes_own_on_the_pass(client, prenorm, sae_folder):
    sae = anatomy.load_sae(sae_folder)
    described = next(m for m in client.get("/api/models").json()["models"] if m["name"] == prenorm)
    assert described["saes"] == [{"name": described["saes"][0]["name"], "point": "blocks.1.resid_post", "d_sae": 16,
                                  "kind": "topk"}]
    data = post(client, "/api/features", model=prenorm, text=TEXT)
    _, cache = anatomy.run_with_cache(model(prenorm), TEXT)
    expected = sae.encode(cache["blocks.1.resid_post"][0])  # (T, F)
    assert data["l0"] == pytest.approx(2.0)  # TopK with k = 2
    for feature in data["features"]:
        torch.testing.assert_close(torch.tensor(feature["acts"]), expected[:, feature["id"]], atol=1e-4, rtol=1e-3)  # 4 digits
    peaks = expected.max(dim=0).values
    assert [f["id"] for f in data["features"]] == [i for i in peaks.argsort(descending=True).tolist() if peaks[i] > 0]
    assert "explains" in data["check"]
    refused = client.post("/api/features", json={"model": "toy", "text": TEXT})
    assert refused.status_code == 400 and "--sae" in refused.json()["error"]


def test_steering_with_a_feature_adds_its_direction(client, prenorm, sae_folder):
    sae = anatomy.load_sae(sae_folder)
    data = post(client, "/api/steer", model=prenorm, text=TEXT, feature=5, alpha=3.0)
    toy = model(prenorm)
    with torch.no_grad(), anatomy.trace(toy, [], interventions={"blocks.1.resid_post": anatomy.sae.steer(sae, 5, 3.0)}):
        after = torch.softmax(toy(torch.tensor([toy.tokenizer.encode_prompt(TEXT)])).logits[0, -1].double(), dim=-1)
    for row in data["rows"]:
        assert row["after"] == pytest.approx(float(after[row["id"]]), abs=1e-6)
    assert data["kl"] > 0
    opened = post(client, "/api/feature", model=prenorm, text=TEXT, feature=5)
    lens = anatomy.sae.analysis.feature_lens(toy, sae, [5], top=10)
    assert opened["logits"]["promoted"] == lens.extra["promoted_tokens"][0]


def test_the_app_is_a_plain_asgi_app_configured_by_the_environment(monkeypatch):
    from starlette.testclient import TestClient

    import anatomy.explore

    monkeypatch.setenv("ANATOMY_EXPLORE_MODELS", "toy,toy-encoder")
    monkeypatch.setenv("ANATOMY_EXPLORE_TOKEN", "from-the-environment")
    monkeypatch.setenv("ANATOMY_EXPLORE_HOSTS", "testserver")
    with TestClient(anatomy.explore.app) as client:  # what `uvicorn anatomy.explore:app` serves
        assert client.get("/api/models").status_code == 401
        models = client.get("/api/models", headers={"Authorization": "Bearer from-the-environment"}).json()
        assert [m["name"] for m in models["models"]] == ["toy", "toy-encoder"]
    monkeypatch.delenv("ANATOMY_EXPLORE_TOKEN")
    with pytest.raises(RuntimeError, match="ANATOMY_EXPLORE_TOKEN"):
        anatomy.explore.app  # noqa: B018 - every worker must share one token: none is refused


def test_the_page_learns_what_each_model_can_do_and_compare_says_what_it_compared(client, prenorm):
    models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
    assert models["toy"]["sums_components"] is False and models[prenorm]["sums_components"] is True
    data = post(client, "/api/compare", model="toy", text=TEXT, text_b="Hello World, this is Alejandro!")
    greedy = data["sides"][1]["greedy_tokens"]
    assert greedy[:1] == ["<EOS>"] and len(greedy) == 1  # greedy stops at the end of the text, as generate does
    encoder = post(client, "/api/compare", model="toy-encoder", text="Hello <MASK>", model_b="toy-seq2seq",
                   text_b="Hello World,")
    assert encoder["greedy_compared"] is False and encoder["first_difference"] is None


def test_integrated_gradients_export_as_their_own_page(client, prenorm):
    page = client.get("/api/export", params={"panel": "attribution", "method": "ig", "format": "html",
                                             "model": prenorm, "text": TEXT, "token": TOKEN})
    assert page.status_code == 200 and "Integrated gradients" in page.text and "completeness" in page.text
