import math


def route(
    logits: list[list[float]], top_k: int, renormalize: bool
) -> list[list[tuple[int, float]]]:
    """Each token's top_k (expert, weight) pairs: softmax, top-k, optional renormalization."""
    routed = []
    for row in logits:
        largest = max(row)
        exps = [math.exp(x - largest) for x in row]
        total = sum(exps)
        probs = [e / total for e in exps]
        kept = sorted(range(len(row)), key=lambda e: (-probs[e], e))[:top_k]
        norm = sum(probs[e] for e in kept) if renormalize else 1.0
        routed.append([(e, probs[e] / norm) for e in kept])
    return routed
