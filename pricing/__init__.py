"""What a request costs, split into input, cached input and output, and how a self-hosted bill is
divided over the tokens that used it so the request costs add up to the bill (metrics-and-cost.md §4)."""
