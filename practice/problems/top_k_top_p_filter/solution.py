def filter_top_k_top_p(probs: list[float], top_k: int, top_p: float) -> list[int]:
    """Ids of the tokens kept by top-k, then top-p, most probable first (ties: smaller id first).

    top_k = -1 means no top-k limit. Top-p works on the top-k tokens' renormalized
    probabilities: a token is kept if the tokens ranked before it hold strictly less than top_p.
    """
    ranked = sorted(range(len(probs)), key=lambda i: (-probs[i], i))
    if top_k != -1:
        ranked = ranked[:top_k]
    total = sum(probs[i] for i in ranked)
    kept: list[int] = []
    mass_before = 0.0
    for token in ranked:
        if mass_before >= top_p:
            break
        kept.append(token)
        mass_before += probs[token] / total
    return kept
