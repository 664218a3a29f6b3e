"""`python -m canopy.server.cli ...`: the `canopy` command without its console script (tests and
the demo spawn the server this way, so a checkout on PYTHONPATH runs its own code).

It imports the package to get the assembled group; nothing imports this module, so that is no
cycle."""

from canopy.server.cli import main

if __name__ == "__main__":  # importing it (as the architecture test does) runs nothing
    main()
