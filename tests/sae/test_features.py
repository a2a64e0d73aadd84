"""Feature pages: the streamed top contexts, densities and histograms are those of all the activations at
once; the logits are the decoder rows through the unembedding; the page is offline and shows tokens as text."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

import anatomy
from analysis_models import FAMILIES, tiny
from anatomy.checkpoints.tokenizer import Tokenizer
from anatomy.sae import SAE
from anatomy.sae.contexts import AFTER, BEFORE
from anatomy.sae.features import HISTOGRAM_EDGES, feature_data, render

TOKENS = np.random.default_rng(2).integers(0, 99, 16 * 13)  # 13 contexts of 16: streamed in 4 batches of 4
TOKENS[::5] = 0  # the hostile token of _hostile_tokenizer, often


def _model_and_sae():
    model = tiny(**FAMILIES["decoder-llama"])
    sae = SAE(32, 48, kind="topk", k=5, point="blocks.1.resid_mid", seed=0).eval()
    with torch.no_grad():
        sae.b_enc.add_(0.2 * torch.randn(48, generator=torch.Generator().manual_seed(0)))
    return model, sae


def test_streamed_top_contexts_density_and_histogram_are_those_of_everything_at_once():
    model, sae = _model_and_sae()
    data = feature_data(model, sae, TOKENS, context=16, skip=1, top=3, batch=4)
    ids = torch.as_tensor(TOKENS).view(13, 16)
    with torch.no_grad(), anatomy.trace(model, "blocks.1.resid_mid") as t:
        model(ids)
    acts = sae.encode(t["blocks.1.resid_mid"])  # (C, T, F)
    acts[:, :1] = 0
    best, where = acts.max(dim=1)  # (C, F)
    expected, contexts = best.T.topk(3, dim=1)  # (F, 3)
    assert torch.allclose(data.values, expected)
    assert torch.allclose(data.density, (acts[:, 1:] > 0).double().mean((0, 1)).float())
    assert data.tokens_scanned == 13 * 15
    assert torch.equal(data.histogram.sum(1), (acts > 0).sum((0, 1)))
    f = int(data.density.argmax())
    for n in range(3):  # each window: the tokens around the context's highest token, and the feature on them
        c, p = int(contexts[f, n]), int(where[int(contexts[f, n]), f])
        for w, offset in enumerate(range(-BEFORE, AFTER + 1)):
            if 0 <= p + offset < 16:
                assert data.windows[f, n, w] == ids[c, p + offset]
                assert torch.isclose(data.window_acts[f, n, w], acts[c, p + offset, f])
            else:
                assert data.windows[f, n, w] == -1
    value = acts[acts[..., f] > 0][:, f][0]
    bin_ = np.searchsorted(HISTOGRAM_EDGES, value.item(), side="right") - 1
    assert data.histogram[f, bin_] >= 1
    gain = model.final_norm.weight.detach()
    logits = (sae.W_dec.detach() * gain) @ model.lm_head.proj.weight.detach().T
    assert torch.equal(data.promoted, logits.topk(8, dim=1).indices)
    assert torch.equal(data.suppressed, logits.topk(8, dim=1, largest=False).indices)


def _hostile_tokenizer(vocab_size: int = 99) -> Tokenizer:
    """A word-level vocabulary whose tokens try to be HTML."""
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel

    words = ["</script><script>alert(1)</script>", "<b>bold</b>", "&amp;", "\u202eevil"] + \
        [f"w{i}" for i in range(vocab_size - 4)]
    return Tokenizer(Backend(WordLevel({w: i for i, w in enumerate(words)}, unk_token="w5")))


def test_the_page_is_offline_and_every_token_is_data_not_markup():
    model, sae = _model_and_sae()
    data = feature_data(model, sae, TOKENS, context=16, top=3)
    document = render(data, _hostile_tokenizer(), title="Features <of> a test", subtitle="x & y")
    assert "default-src 'none'" in document and "<title>Features &lt;of&gt; a test</title>" in document
    assert "</script><script>alert" not in document and "<b>bold</b>" not in document
    payload = json.loads(re.search(r'<script type="application/json" id="anatomy-data">(.*?)</script>', document, re.S)[1])
    assert payload["nFeatures"] == 48 and payload["top"] == 3 and payload["window"] == BEFORE + 1 + AFTER
    assert "</script><script>alert(1)</script>" in payload["texts"]  # token 0 is in the text: there, as data
    assert not re.search(r"https?://", document.split("<script>")[0])  # no address in the markup or the style


@pytest.mark.browser
def test_the_page_in_chromium_searches_by_token_and_sorts_by_density(browser, tmp_path):
    model, sae = _model_and_sae()
    data = feature_data(model, sae, TOKENS, context=16, top=3)
    path = tmp_path / "features.html"
    path.write_text(render(data, _hostile_tokenizer(), title="Features", subtitle=""))
    page = browser.new_page()
    requests, errors = [], []
    page.on("request", lambda r: requests.append(r.url) if not r.url.startswith("file:") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("article.feature")
    assert not requests and not errors
    shown = page.eval_on_selector_all("article.feature", "cards => cards.map(c => Number(c.id.slice(1)))")
    alive = [f for f in torch.argsort(-data.density, stable=True).tolist() if data.density[f] > 0]
    assert shown == alive[:len(shown)]  # densest first
    page.select_option("select[name=sort]", "density-asc")
    shown = page.eval_on_selector_all("article.feature", "cards => cards.map(c => Number(c.id.slice(1)))")
    assert [float(data.density[f]) for f in shown] == sorted(float(data.density[f]) for f in shown)
    token = _hostile_tokenizer().token_texts([int(data.windows[shown[0], 0, BEFORE])])[0]
    page.fill("#search", token)
    found = page.eval_on_selector_all("article.feature", "cards => cards.map(c => Number(c.id.slice(1)))")
    assert shown[0] in found
    page.fill("#search", "")
    texts = page.eval_on_selector_all(".tok", "spans => spans.map(s => s.textContent)")
    assert "</script><script>alert(1)</script>" in texts  # the hostile token, shown as its text
    assert page.locator("script").count() == 2  # the page's data and its one script: no token became a script
    page.fill("#search", f"#{shown[0]}")
    assert page.eval_on_selector_all("article.feature", "cards => cards.length") == 1
    page.close()
