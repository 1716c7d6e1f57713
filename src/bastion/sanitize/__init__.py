"""Output sanitization: hidden text, secrets, prompt-injection markers, size and type limits."""
