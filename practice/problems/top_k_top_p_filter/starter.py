def filter_top_k_top_p(probs: list[float], top_k: int, top_p: float) -> list[int]:
    """Ids of the tokens kept by top-k, then top-p, most probable first (ties: smaller id first).

    top_k = -1 means no top-k limit. Top-p works on the top-k tokens' renormalized
    probabilities: a token is kept if the tokens ranked before it hold strictly less than top_p.
    """
    raise NotImplementedError("keep the top-k, renormalize, then cut by top-p")
