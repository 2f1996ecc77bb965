import math


def route(
    logits: list[list[float]], top_k: int, renormalize: bool
) -> list[list[tuple[int, float]]]:
    """Each token's top_k (expert, weight) pairs: softmax, top-k, optional renormalization."""
    raise NotImplementedError("softmax over all experts, keep the top_k, renormalize if asked")
