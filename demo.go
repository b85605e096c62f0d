package main

import _ "embed"

// The browser client and its demo page live in client/ (a second artifact,
// published to npm from there); the node serves the same bytes at
// /roost.js in every mode and the demo at / in insecure mode.
var (
	//go:embed client/roost.js
	clientScript []byte
	//go:embed client/demo.html
	demoPage []byte
)
