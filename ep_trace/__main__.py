from ep_trace.cli import main

main()
