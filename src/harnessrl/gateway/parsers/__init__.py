"""Reading a sampled answer back: tool calls (``tools``, one parser per model family), reasoning
blocks (``reasoning``), and which of them a model speaks (``formats``)."""
