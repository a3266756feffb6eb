"""`strata` subcommands that run models: generate, chat, perplexity, demo. Each module parses
its arguments and calls the public API (`strata.load`), nothing more."""
