"""The simulated social app: the event contract, id generation, the HTTP API and the load generators.

Every command of the app becomes one immutable event appended to the ``social.events`` log;
nothing here writes derived state.
"""
