package main

import _ "embed"

// demoPage is served at / in insecure mode: a page to try the node.
//
//go:embed docs/demo.html
var demoPage []byte
