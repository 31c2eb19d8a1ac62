from edgeocr.cli import main

raise SystemExit(main())
