"""Pure numerics of the converter (numpy + ml_dtypes, no I/O).

``constants`` holds the format facts, ``elements`` the element encodings, ``resolve`` the
block-FP8 tile resolve, ``mx`` the reference MX quantizer and ``metrics`` the error measures.
The contract they implement is sections 3 and 4 of ``docs/contract.md``.
"""
