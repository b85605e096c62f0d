package main

import _ "embed"

// The browser client and its demo page live in client/ (a second artifact,
// packed for npm from there); the node serves the same bytes at /roost.js
// in every mode and the demo at / in insecure mode. The admin page, also
// in client/, is served at / on the admin listener.
var (
	//go:embed client/roost.js
	clientScript []byte
	//go:embed client/demo.html
	demoPage []byte
	//go:embed client/admin.html
	adminPage []byte
)
