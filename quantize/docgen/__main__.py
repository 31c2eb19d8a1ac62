from quantize.docgen import main

raise SystemExit(main())
