from quantize.cli import main

raise SystemExit(main())
