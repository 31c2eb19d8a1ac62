from quantize.htmldocs import main

raise SystemExit(main())
