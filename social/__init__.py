"""``social``: the project's one command line, on the top floor; ``social --help`` lists its commands.

Each command wraps one module's own ``main(argv)`` (:mod:`social.cli`); nothing imports this package.
"""
