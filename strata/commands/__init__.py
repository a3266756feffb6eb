"""Every `strata` subcommand, and `python -m strata.convert`: one module per command (bench,
chat, convert, demo, generate, inspect, perplexity). Each parses its arguments, calls the public
API (`strata.load`, `strata.gguf`, `strata.bench`, `converters`) and formats what comes back;
none holds engine logic. Errors end every command the same way (`errors.run_guarded`)."""
