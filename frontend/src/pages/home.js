// Home page: no extra behaviour yet; kept so every page has a bundle of its own to grow into.
