from tuneforge.cli import main

main()
