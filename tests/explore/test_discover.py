"""The discover panel's job: its numbers are the library's (circuits.discovery on the same pairs), its
page is the circuits floor's graph page, and bad settings are refused before a job starts."""

from __future__ import annotations

import json

import torch

import anatomy
from anatomy.circuits.discovery import attribute_edges, faithfulness, make_task, top_edges

PAIRS = [{"clean": "Hello World, this is", "corrupt": "Hello World, is this", "answer": " Alejandro!", "wrong": " is"},
         {"clean": "World, this is", "corrupt": "World, is this", "answer": " Alejandro!", "wrong": " this"},
         {"clean": "Hello World, this", "corrupt": "Hello World, is", "answer": " is", "wrong": " this"}]


def last_event(client, job_id):
    with client.stream("GET", f"/api/jobs/{job_id}/events") as response:
        text = "".join(response.iter_text())
    block = text.strip().split("\n\n")[-1].split("\n")
    return block[0][len("event: "):], json.loads(block[1][len("data: "):])


def test_a_circuit_over_typed_pairs_equals_the_library(client, prenorm):
    job = client.post("/api/jobs", json={"model": prenorm, "kind": "discover", "task": "custom", "custom": PAIRS,
                                         "method": "eap-ig", "steps": 3})
    assert job.status_code == 202, job.text
    kind, data = last_event(client, job.json()["id"])
    assert kind == "result", data
    result = data["result"]
    model = anatomy.from_pretrained(prenorm)
    task = make_task(model, "custom", PAIRS)
    edges = attribute_edges(model, task, method="eap-ig", steps=3)
    curve = faithfulness(model, task, edges)
    assert result["pairs"] == 3 and result["sizes"] == curve.extra["sizes"] and result["smallest"] == curve.extra["smallest"]
    torch.testing.assert_close(torch.tensor(result["faithfulness"], dtype=torch.float64), curve.values, atol=1e-3, rtol=1e-3)
    graph = edges.extra["graph"]
    expected = [[graph.edge_name(u, v), score] for u, v, score in top_edges(edges, len(result["top"]))]
    assert [name for name, _ in result["top"]] == [name for name, _ in expected]
    torch.testing.assert_close(torch.tensor([s for _, s in result["top"]]), torch.tensor([s for _, s in expected]),
                               atol=1e-6, rtol=1e-3)
    page = client.get(f"/api/jobs/{job.json()['id']}/page")
    assert page.status_code == 200 and "Circuit" in page.text and "view-graph" in page.text


def test_bad_settings_are_refused_before_a_job(client, prenorm):
    cases = [({"task": "poetry"}, "'task' must be one of ioi"), ({"task": "ioi", "pairs": 0}, "'pairs' must be an integer"),
             ({"task": "ioi", "method": "acdc"}, "'method' must be one of eap, eap-ig"),
             ({"task": "custom", "custom": [{"clean": "a"}]}, "custom pair 0"),
             ({"task": "ioi", "steps": 500}, "'steps' must be an integer from 1 to 20")]
    for settings, words in cases:
        response = client.post("/api/jobs", json={"model": prenorm, "kind": "discover", **settings})
        assert response.status_code == 400 and words in response.json()["error"], response.text
    post_norm = client.post("/api/jobs", json={"model": "toy", "kind": "discover", "task": "ioi"})
    assert post_norm.status_code == 400 and "post-norm block" in post_norm.json()["error"]


def test_a_pair_of_unequal_length_ends_the_job_with_its_reason(client, prenorm):
    pairs = [{"clean": "Hello World, this is", "corrupt": "Hello World, this", "answer": " is", "wrong": " this"}]
    job = client.post("/api/jobs", json={"model": prenorm, "kind": "discover", "task": "custom", "custom": pairs})
    kind, data = last_event(client, job.json()["id"])
    assert kind == "error" and "as many tokens" in data["error"]
