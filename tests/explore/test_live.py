"""The explorer stays live (issue 27): a decoder's keystroke continues the last text's pass and its lens
rows, and every panel's numbers still equal the library's on the whole text; long axes come a window
or a thumbnail at a time; the walk's costly steps wait until opened; requests wait in lanes, the
newest first, and one whose browser left is dropped before it computes."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
import torch.nn.functional as F

import anatomy
from anatomy.explore import create_app
from anatomy.explore.lanes import Gone, Lane, Lanes
from explore_servers import TOKEN, post
from starlette.testclient import TestClient

# A typing session on the toy: each text shares a prefix of ids with the one before (the last word
# retokenised, words appended, one deleted)
SESSION = ["Hello World,", "Hello World, this", "Hello World, this is", "Hello World, is", "Hello World, is this"]


@pytest.fixture(scope="module")
def client(long_toy):
    app = create_app(["toy", "toy-encoder", long_toy], token=TOKEN, hosts=["testserver"])
    with TestClient(app, base_url="http://testserver") as test_client:
        test_client.headers["Authorization"] = f"Bearer {TOKEN}"
        test_client.app_state = app.state
        yield test_client


def test_a_keystroke_computes_only_the_positions_after_the_shared_prefix(client):
    toy = anatomy.from_pretrained("toy")
    computed = []
    for text in SESSION:
        data = post(client, "/api/run", model="toy", text=text)
        output, _ = anatomy.run_with_cache(toy, text)
        probs = torch.softmax(output.logits[0, -1], dim=-1)
        assert [row["id"] for row in data["next"]] == probs.topk(len(data["next"])).indices.tolist()
        torch.testing.assert_close(torch.tensor([r["prob"] for r in data["next"]]),
                                   probs.topk(len(data["next"])).values, atol=1e-6, rtol=0)
        computed.append(data["computed"])
    # <SOS> Hello World, | this | is | (is replaces this) | this
    assert computed == [3, 1, 1, 1, 1]


def test_the_lens_of_a_continued_pass_is_the_lens_of_its_text(client):
    toy = anatomy.from_pretrained("toy")
    for text in SESSION:
        data = post(client, "/api/lens", model="toy", text=text, top=2)
        lens = anatomy.logit_lens(toy, text, top=2)
        assert data["tokens"] == [layer[0] for layer in lens.extra["top_tokens"]]
        torch.testing.assert_close(torch.tensor(data["probs"]), lens.extra["top_probs"][:, 0], atol=1e-4, rtol=0)
        view = data["view"]["panels"][0]
        for target in view["targets"]:  # the probabilities a reader may shade by: the library's
            token = toy.tokenizer.encode(target["token"], add_special_tokens=False)[0]
            torch.testing.assert_close(torch.tensor(target["probs"]), lens.values[:, 0, :, token].exp(), atol=1e-5, rtol=0)
        assert data["view"]["check"]["status"] == "holds"


def test_the_lens_comes_a_window_of_positions_at_a_time(client, long_toy):
    text = " ".join(["Hello World, this is Alejandro!"] * 60)
    whole = post(client, "/api/lens", model=long_toy, text=text, top=1)
    total = whole["total"]
    assert total > 256 and len(whole["cols"]) == total
    window = post(client, "/api/lens", model=long_toy, text=text, top=1, start=100, count=7)
    assert (window["start"], window["stop"]) == (100, 107) and window["cols"] == whole["cols"][100:107]
    assert window["tokens"] == [layer[100:107] for layer in whole["tokens"]]
    assert window["view"]["panels"][0]["colKeys"] == list(range(100, 107))
    newest = post(client, "/api/lens", model=long_toy, text=text, top=1, count=5)
    assert (newest["start"], newest["stop"]) == (total - 5, total)


def test_a_long_attention_comes_one_head_or_thumbnails_at_a_time(client, long_toy):
    text = " ".join(["Hello World, this is Alejandro!"] * 60)
    one = post(client, "/api/attention", model=long_toy, text=text, layer=1, head=1, heads="one")
    _, cache = anatomy.run_with_cache(anatomy.from_pretrained(long_toy), text)
    pattern = cache["blocks.1.attn.pattern"][0]  # (H, T, T)
    assert one["heads_shown"] == [1]
    torch.testing.assert_close(torch.tensor(one["weights"][0]), pattern[1], atol=1e-4, rtol=0)
    thumbs = post(client, "/api/attention", model=long_toy, text=text, layer=1, thumbnail=54)
    assert "weights" not in thumbs
    torch.testing.assert_close(torch.tensor(thumbs["thumbnails"]), F.adaptive_avg_pool2d(pattern, (54, 54)),
                               atol=1e-3, rtol=0)
    assert client.post("/api/attention", json={"model": "toy", "text": "Hello", "heads": "two"}).status_code == 400


def test_the_walks_costly_steps_are_built_when_opened(client):
    closed = post(client, "/api/walk", model="toy", text="Hello World, this is")
    later = [s for s in closed["steps"] if not s["built"]]
    assert [s["title"] for s in later] == ["Output projection: logits", "Next-token probabilities"]
    assert all(s["ok"] is None and s["html"] is None for s in later) and closed["later"] == 2
    opened = post(client, "/api/walk", model="toy", text="Hello World, this is", open=[later[0]["number"]])
    step = next(s for s in opened["steps"] if s["number"] == later[0]["number"])
    assert step["built"] and step["ok"] and "H·W" in step["html"] and opened["checks"] > closed["checks"]
    assert client.post("/api/walk", json={"model": "toy", "text": "Hello", "open": "all"}).status_code == 400


def test_a_text_of_512_tokens_is_read_and_a_longer_one_refused_with_the_limit(client, long_toy):
    toy = anatomy.from_pretrained(long_toy)
    words = "Hello World, this is Alejandro!".split()
    text = " ".join(words[i % len(words)] for i in range(511))  # <SOS> and 511 words
    assert len(toy.tokenizer.encode_prompt(text)) == 512
    assert len(post(client, "/api/run", model=long_toy, text=text)["tokens"]) == 512
    refused = client.post("/api/run", json={"model": long_toy, "text": text + " Hello"})
    assert refused.status_code == 413 and "at most 512" in refused.json()["error"]


def test_an_encoder_recomputes_in_full(client):
    first = post(client, "/api/run", model="toy-encoder", text="Hello World, this <MASK> Alejandro!")
    second = post(client, "/api/run", model="toy-encoder", text="Hello World, this <MASK> Alejandro! is")
    assert first["computed"] == len(first["tokens"]) and second["computed"] == len(second["tokens"])


# ---- the lanes ----------------------------------------------------------------------------------


def run(main):
    """asyncio.run(main()) in a thread of its own: a browser test of this session (Playwright's sync
    API) may have left an event loop running in this one."""
    outcome = {}

    def target():
        try:
            outcome["value"] = asyncio.run(main())
        except BaseException as error:  # noqa: BLE001 - raised again in the test's thread
            outcome["error"] = error

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(30)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class Browser:
    """A request's side of the connection, for Lane.run: gone or still there."""

    def __init__(self, gone: bool = False):
        self.gone = gone

    async def is_disconnected(self) -> bool:
        return self.gone


def test_the_newest_waiting_request_goes_first():
    async def main():
        lane, order, release = Lane(), [], threading.Event()
        first = asyncio.create_task(lane.run(Browser(), lambda: (release.wait(10), order.append("first"))))
        await asyncio.sleep(0.05)  # `first` computes; the others wait
        waiting = [asyncio.create_task(lane.run(Browser(), lambda n=n: order.append(n))) for n in ("older", "newer")]
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, *waiting)
        return order

    assert run(main) == ["first", "newer", "older"]


def test_a_request_whose_browser_left_is_dropped_before_it_computes():
    async def main():
        lane, ran, release = Lane(), [], threading.Event()
        busy = asyncio.create_task(lane.run(Browser(), lambda: release.wait(10)))
        await asyncio.sleep(0.05)
        left = Browser()
        superseded = asyncio.create_task(lane.run(left, lambda: ran.append("superseded")))
        await asyncio.sleep(0.05)
        left.gone = True  # the page cancelled it: a newer keystroke
        with pytest.raises(Gone):
            await superseded
        release.set()
        await busy
        await lane.run(Browser(), lambda: ran.append("next"))
        return ran, lane

    ran, lane = run(main)
    assert ran == ["next"] and not lane.waiting and not lane.busy


def test_a_quick_request_never_waits_behind_the_slow_lane():
    async def main():
        lanes, release = Lanes(), threading.Event()
        walk = asyncio.create_task(lanes.lane("smollm2", "slow").run(Browser(), lambda: release.wait(10)))
        await asyncio.sleep(0.05)
        answer = await lanes.lane("smollm2", "quick").run(Browser(), lambda: "next token")
        still_walking = not walk.done()
        release.set()
        await walk
        return answer, still_walking

    assert run(main) == ("next token", True)
    with pytest.raises(ValueError, match="'quick' or 'slow'"):
        Lanes().lane("toy", "fast")


def test_passes_of_different_texts_are_made_at_once_and_one_text_is_made_once():
    from anatomy.explore.state import Models, Passes

    class Blocking(Passes):
        """Its pass of "slow" waits until released: another client's long pass."""

        def __init__(self):
            super().__init__()
            self.release, self.made = threading.Event(), []

        def _run(self, slot, text, target):
            if text == "slow":
                self.release.wait(10)
            self.made.append(text)
            return super()._run(slot, text, target)

    passes, slot = Blocking(), Models(["toy"]).slot("toy")
    slow = [threading.Thread(target=lambda: passes.get(slot, "slow")) for _ in range(2)]
    for thread in slow:
        thread.start()
    quick = passes.get(slot, "Hello World,")  # not held up by the other text's pass
    assert quick.tokens == ["<SOS>", "Hello", "World,"] and passes.made == ["Hello World,"]
    passes.release.set()
    for thread in slow:
        thread.join(10)
    assert passes.made == ["Hello World,", "slow"]  # both requests for "slow" shared one pass


def test_work_whose_browser_left_while_it_computes_is_told_to_stop():
    from anatomy.explore.lanes import raise_if_gone

    async def main():
        lane, browser, steps = Lane(), Browser(), []

        def work():  # a computation that asks between its steps, as a pass does at its trace points
            for _ in range(1000):
                raise_if_gone()
                steps.append(1)
                threading.Event().wait(0.005)
            return "done"

        running = asyncio.create_task(lane.run(browser, work))
        await asyncio.sleep(0.05)
        browser.gone = True
        with pytest.raises(Gone):
            await running
        return len(steps), lane

    steps, lane = run(main)
    assert 0 < steps < 1000 and not lane.busy
