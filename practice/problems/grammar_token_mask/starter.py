def allowed_tokens(vocab: list[str], outputs: set[str], prefix: str, eos: int) -> set[int]:
    """The ids of the tokens that may follow `prefix` when the output must be one of `outputs`.

    A token is allowed when prefix + its text still begins some output (empty texts never);
    eos exactly when prefix is a complete output.
    """
    raise NotImplementedError("allowed_tokens: the next tokens a finite grammar allows")
