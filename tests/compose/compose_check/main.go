// compose_check loads a Compose file the way Docker Compose v2 does (with compose-go, the library
// `docker compose` itself loads files with) and prints the services one command would run, as JSON.
//
//	compose_check -f FILE [-project-directory DIR] -p NAME [-profile P]... [-env KEY=VALUE]... [SERVICE...]
//
// It follows `docker compose --profile P up SERVICE...`: the file is parsed, validated against the
// Compose Specification schema, interpolated with the given environment (and only that: the
// check does not depend on the caller's), normalized and checked for consistency; the profiles
// given are enabled; services named on the command line enable their own profiles, and the
// selection is narrowed to them and what they depend on (docker/compose pkg/compose/loader.go,
// postProcessProject). A file compose-go refuses is an error on stderr and exit status 1.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
)

type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

type output struct {
	Name     string                         `json:"name"`
	Profiles []string                       `json:"profiles"`
	Services map[string]types.ServiceConfig `json:"services"`
	Disabled []string                       `json:"disabled"`
}

func run() error {
	var file, dir, name string
	var profiles, env repeated
	flag.StringVar(&file, "f", "docker-compose.yml", "the Compose file")
	flag.StringVar(&dir, "project-directory", "", "the project directory (default: the file's)")
	flag.StringVar(&name, "p", "", "the project name")
	flag.Var(&profiles, "profile", "a profile to enable (repeatable)")
	flag.Var(&env, "env", "KEY=VALUE for interpolation (repeatable)")
	flag.Parse()
	selected := flag.Args()

	abs, err := filepath.Abs(file)
	if err != nil {
		return err
	}
	if dir == "" {
		dir = filepath.Dir(abs)
	}
	options, err := cli.NewProjectOptions(
		[]string{abs},
		cli.WithWorkingDirectory(dir),
		cli.WithEnv(env),
		cli.WithDefaultProfiles(profiles...),
		cli.WithName(name),
	)
	if err != nil {
		return err
	}
	project, err := options.LoadProject(context.Background())
	if err != nil {
		return err
	}
	// what `docker compose up SERVICE...` does after loading
	project, err = project.WithServicesEnabled(selected...)
	if err != nil {
		return err
	}
	project, err = project.WithSelectedServices(selected)
	if err != nil {
		return err
	}
	disabled := make([]string, 0, len(project.DisabledServices))
	for n := range project.DisabledServices {
		disabled = append(disabled, n)
	}
	sort.Strings(disabled)
	encoder := json.NewEncoder(os.Stdout)
	encoder.SetIndent("", "  ")
	return encoder.Encode(output{
		Name:     project.Name,
		Profiles: project.Profiles,
		Services: project.Services,
		Disabled: disabled,
	})
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "compose_check:", err)
		os.Exit(1)
	}
}
