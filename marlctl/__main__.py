from marlctl.cli import main

main()
