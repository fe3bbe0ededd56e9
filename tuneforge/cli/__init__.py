"""The command line. `main` imports the commands only when called, so that importing one
command's module stays light."""


def main() -> None:
    from tuneforge.cli.main import main as run

    run()
