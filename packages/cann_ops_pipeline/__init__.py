"""The development pipeline of the monorepo: what each phase runs, shared by nox and invoke.

Not shipped in the operator wheel. Pure standard library, so the noxfile can import it before
any virtual environment exists.
"""
