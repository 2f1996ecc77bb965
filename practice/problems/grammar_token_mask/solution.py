def allowed_tokens(vocab: list[str], outputs: set[str], prefix: str, eos: int) -> set[int]:
    """The ids of the tokens that may follow `prefix` when the output must be one of `outputs`.

    A token is allowed when prefix + its text still begins some output (empty texts never);
    eos exactly when prefix is a complete output.
    """
    allowed = {eos} if prefix in outputs else set()
    for i, piece in enumerate(vocab):
        if i != eos and piece and any(o.startswith(prefix + piece) for o in outputs):
            allowed.add(i)
    return allowed
