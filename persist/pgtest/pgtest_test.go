package pgtest

import "testing"

// TestDBURL: a test database's URL names it whatever the admin URL's form,
// with or without a query, and keeps the rest.
func TestDBURL(t *testing.T) {
	for _, c := range []struct{ admin, want string }{
		{"postgres://postgres@127.0.0.1:5432/test", "postgres://postgres@127.0.0.1:5432/roost_test_x"},
		{"postgres://postgres@127.0.0.1:5432/test?sslmode=disable", "postgres://postgres@127.0.0.1:5432/roost_test_x?sslmode=disable"},
		{"postgresql://u:p@h/test?sslmode=disable&x=test", "postgresql://u:p@h/roost_test_x?sslmode=disable&x=test"},
		{"postgres://h", "postgres://h/roost_test_x"},
	} {
		t.Setenv("ROOST_TEST_DATABASE_URL", c.admin)
		if got := dbURL(t, "roost_test_x"); got != c.want {
			t.Errorf("%s: %s, want %s", c.admin, got, c.want)
		}
	}
}
