from deployctl.cli import main

main()
