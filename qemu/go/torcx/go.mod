// Wrapper module that builds the real torcx (github.com/coreos/torcx) v0.2.0,
// the version Container Linux shipped (coreos-overlay app-arch/torcx/torcx-0.2.0-r1,
// CROS_WORKON_COMMIT c33a93e8c5e6). torcx itself has no go.mod (glide + vendor/);
// the requires below are exactly the commits of its glide.lock, so the compiled
// dependency code is byte-identical to torcx's vendor/ tree.
module nodestrap.local/torcxbuild

go 1.26

require github.com/coreos/torcx v0.2.0

require (
	github.com/euank/gotmpl v0.1.0 // ed7fb72c02be
	github.com/fsnotify/fsnotify v1.4.7 // c2828203cd70
	github.com/hashicorp/hcl v0.0.0-20180404174102-ef8a98b0bbce
	github.com/inconshreveable/mousetrap v1.0.0 // 76626ae9c91c (windows-only, not compiled)
	github.com/magiconair/properties v1.7.7-0.20180217134545-2c9e95027885
	github.com/mitchellh/mapstructure v0.0.0-20180511142126-bb74f1db0675
	github.com/northbright/ctx v0.0.0-20161024043329-d1b203ae2564
	github.com/opencontainers/go-digest v1.0.0-rc1 // 279bed98673d
	github.com/pelletier/go-toml v1.1.1-0.20180323185243-66540cf1fcd2
	github.com/pkg/errors v0.8.0 // 645ef00459ed
	github.com/sirupsen/logrus v1.0.4 // d682213848ed
	github.com/spf13/afero v1.1.0 // 63644898a8da
	github.com/spf13/cast v1.2.0 // 8965335b8c71
	github.com/spf13/cobra v0.0.0-20170309154509-16c014f1a19d
	github.com/spf13/jwalterweatherman v0.0.0-20180109140146-7c0cea34c8ec
	github.com/spf13/pflag v0.0.0-20170130214245-9ff6c6923cff
	github.com/spf13/viper v0.0.0-20170217163817-7538d73b4eb9
	golang.org/x/crypto v0.0.0-20180411161317-d6449816ce06
	golang.org/x/net v0.0.0-20160726221601-6a513affb38d
	golang.org/x/sys v0.0.0-20180202135801-37707fdb30a5
	golang.org/x/text v0.3.1-0.20180511172408-5c1cf69b5978
	gopkg.in/yaml.v2 v2.2.1 // 5420a8b6744d
)
